"""``stagewise serve`` process edges: a busy port, a missing model, a signal while the model loads."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.test_server_support import make_model_dir, start_server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("process-model"))


def test_busy_port_is_one_line_before_loading(model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        log = tmp_path / "busy.log"
        served = start_server(model_dir, log, "--placement", "single", "--port", str(port))  # the last --port wins
        assert served.process.wait(60) == 2
    text = log.read_text()
    assert "listening" not in text and "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("stagewise: error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0], text


@pytest.mark.parametrize(("model", "named"), [("missing.gguf", "not a .gguf file or a model directory"),
                                             ("random:no-such-preset", "no such config file or preset")])
def test_missing_model_is_one_line_before_listening(tmp_path: Path, model: str, named: str) -> None:
    log = tmp_path / "missing.log"
    served = start_server(tmp_path / model if model.endswith(".gguf") else Path(model), log, "--placement", "single")
    assert served.process.wait(60) == 2
    text = log.read_text()
    assert "listening" not in text and "Traceback" not in text
    errors = [line for line in text.splitlines() if line.startswith("stagewise: error:")]
    assert len(errors) == 1 and named in errors[0], text


def test_sigterm_while_loading_exits_cleanly(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "early.log"
    served = start_server(model_dir, log, "--placement", "single")
    deadline = time.monotonic() + 60
    while "listening" not in log.read_text():  # printed once the port is bound, before loading
        assert time.monotonic() < deadline and served.process.poll() is None, log.read_text()
        time.sleep(0.005)
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(60) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text and "Abort" not in text and "terminate called" not in text


def test_serve_random_preset_answers_chat(tmp_path: Path) -> None:
    log = tmp_path / "random.log"
    served = start_server(Path("random:tiny-llama"), log, "--placement", "single")
    try:
        served.wait_ready()
        body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
        r = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        assert r.json()["model"] == "random:tiny-llama"
    finally:
        assert served.stop() == 0, log.read_text()[-3000:]
