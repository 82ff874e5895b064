"""The commands the serve banner prints run as printed: the curl (API key expanded by the shell) and the chat."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from stagewise.engine.load_settings import LoadSettings
from stagewise.server.load_display import chat_command, usage_lines
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_support import REPO, make_model_dir, serving, start_server

HANG_S = 120  # a bound on a hang, not a measure


def test_curl_reads_the_key_in_double_quotes() -> None:
    lines = usage_lines(ServeSettings(api_key="k", port=9000), key_in_env=True)
    assert len(lines) == 2 and '-H "Authorization: Bearer $STAGEWISE_API_KEY"' in lines[0]
    assert lines[0].startswith("  curl http://127.0.0.1:9000/v1/chat/completions ")
    assert usage_lines(ServeSettings(api_key="k"), key_in_env=False)[0] == (
        "  (with STAGEWISE_API_KEY set to the --api-key value)")
    assert "Authorization" not in usage_lines(ServeSettings(), key_in_env=False)[0]


def test_chat_loads_the_model_as_serve_did() -> None:
    assert chat_command(ServeSettings()) == ["stagewise", "chat"]  # the demo, with its own defaults
    settings = ServeSettings(LoadSettings(model="random:tiny-llama", devices="cpu:2x1GiB", placement="pipeline:2",
                                          context=512, dtype="f32", cuda_graphs=False, max_seqs=8), port=1234)
    assert chat_command(settings) == ["stagewise", "chat", "random:tiny-llama", "--devices", "cpu:2x1GiB",
                                      "--placement", "pipeline:2", "--context", "512", "--dtype", "f32",
                                      "--no-cuda-graphs"]


def _banner(log: Path) -> list[str]:
    deadline = time.monotonic() + HANG_S
    while "or chat in the terminal" not in log.read_text():  # printed just after /health turns 200
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    lines = log.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Serving "))
    return lines[start + 1:start + 4]


def test_the_printed_commands_run(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "m")
    log = tmp_path / "serve.log"
    env = {**os.environ, "STAGEWISE_API_KEY": "sekret"}  # as the note says
    with serving(start_server(model, log, "--devices", "cpu:1GiB", api_key="sekret")) as served:
        note, curl, chat = _banner(log)
        assert note.strip() == "(with STAGEWISE_API_KEY set to the --api-key value)"
        assert curl.split()[1].startswith(served.url)
        reply = subprocess.run(["bash", "-c", curl + " -sS -w '\\n%{http_code}'"], env=env, capture_output=True,
                               text=True, timeout=HANG_S)
        body, status = reply.stdout.rsplit("\n", 1)
        assert status == "200", reply
        assert json.loads(body)["object"] == "chat.completion"
    command = shlex.split(chat.split(": ", 1)[1])
    assert command[:3] == ["stagewise", "chat", str(model)]
    done = subprocess.run([sys.executable, "-m", *command], input="Hi\n/exit\n", cwd=REPO, capture_output=True,
                          text=True, timeout=HANG_S, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
