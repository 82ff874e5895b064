"""The API process of ``stagewise serve`` imports no torch: it owns HTTP, tokenization, chat templates, grammar
compilation, detokenization and streaming; only the engine process loads the model's libraries."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_server_support import REPO, ServedModel, make_model_dir, serving_tiny_model, start_server

HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
    "ok": {"type": "boolean"}}, "required": ["ok"]}}}
API_MODULES = ("stagewise.cli.main", "stagewise.cli.cmd_serve", "stagewise.server.runner")


def _torch_mapped(pid: int) -> list[str]:
    """The torch files process ``pid`` has mapped (its native libraries, once imported)."""
    return sorted({line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
                   if "/torch/" in line})


def test_the_api_side_imports_no_torch() -> None:
    code = (f"import sys\nfor name in {API_MODULES!r}:\n    __import__(name)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:2000]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    with serving_tiny_model(tmp_path_factory) as served:
        yield served


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_a_serving_api_process_has_no_torch_loaded(server: ServedModel) -> None:
    """Every path the API process serves (templates, grammars, streaming, tokenize, status, metrics), then
    its mappings: torch's libraries are in the engine process only."""
    url = server.url
    for body in ({"messages": HELLO, "max_tokens": 4},
                 {"messages": HELLO, "max_tokens": 4, "stream": True, "logprobs": True, "top_logprobs": 2},
                 {"messages": HELLO, "max_tokens": 8, "response_format": SCHEMA}):
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": "x", **body}, timeout=60)
        assert r.status_code == 200, r.text[:500]
    r = httpx.post(f"{url}/v1/completions", json={"model": "x", "prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text[:500]
    tokens = httpx.post(f"{url}/tokenize", json={"messages": HELLO}, timeout=30).json()["tokens"]
    assert httpx.post(f"{url}/detokenize", json={"tokens": tokens}, timeout=30).status_code == 200
    for path in ("/v1/stagewise/status", "/metrics", "/v1/models", "/health"):
        assert httpx.get(f"{url}{path}", timeout=30).status_code == 200, path
    engine_pid = httpx.get(f"{url}/v1/stagewise/status", timeout=30).json()["live"]["engine_process"]["pid"]
    assert _torch_mapped(engine_pid), "the engine process should have torch loaded (the check reads mappings)"
    assert _torch_mapped(server.process.pid) == []


def test_serve_refuses_a_bad_kernel_setting_in_one_line(tmp_path: Path) -> None:
    """A bad STAGEWISE_KERNELS: the typed one-line error and exit 2 before the server listens or any
    model loads (the check reads the environment without torch)."""
    model_dir = make_model_dir(tmp_path / "x")
    served = start_server(model_dir, tmp_path / "serve.log", "--placement", "single",
                          env={"STAGEWISE_KERNELS": "cuda-graphs"})
    assert served.process.wait(timeout=120) == 2
    log = served.log.read_text()
    assert "stagewise: error: STAGEWISE_KERNELS='cuda-graphs': expected 'triton' or 'torch'" in log.splitlines(), log
    assert "Traceback" not in log
    assert "listening" not in log.lower() and "http://" not in log, "refused before the server starts"
