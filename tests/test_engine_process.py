"""``stagewise serve`` with its engine in a process of its own: killing that process mid-stream fails the
stream with a typed 503 (OpenAI's error shape) at once, new requests get the same 503, and a fresh
engine process serves again."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.test_server_support import ServedModel, make_model_dir, serving, serving_tiny_model, start_server

HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]
NO_STOP = {"0": -100, "1": -100, "2": -100}  # the demo tokenizer's specials (EOS among them) never drawn
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    with serving_tiny_model(tmp_path_factory) as served:
        yield served


def _engine_process(server: ServedModel) -> dict[str, int]:
    live = httpx.get(f"{server.url}/v1/stagewise/status", timeout=30).json()["live"]
    info: dict[str, int] = live["engine_process"]
    return info


def _chat(server: ServedModel, **extra: object) -> httpx.Response:
    body = {"model": "x", "messages": HELLO, "max_tokens": 4, **extra}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)


def test_status_names_the_engine_process(server: ServedModel) -> None:
    info = _engine_process(server)
    assert info["pid"] != server.process.pid and info["restarts"] == 0
    os.kill(info["pid"], 0)  # a live process of its own


def _nice(pid: int, tid: int | None = None) -> int:
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[16])  # field 19 of proc(5), after the command's parentheses


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are Linux's")
def test_http_yields_the_cpu_to_the_engine(server: ServedModel) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # what the server started with
    api = server.process.pid
    assert _nice(api) == min(19, own + 10)  # the HTTP thread (and the threads it starts) gives way
    assert _nice(_engine_process(server)["pid"]) == own  # the engine process keeps the default priority


def test_killed_engine_process_is_503_then_restarts(server: ServedModel) -> None:
    before = _engine_process(server)
    assert httpx.post(f"{server.url}/debug/step-delay", json={"seconds": 0.05}, timeout=30).status_code == 200
    body = {"model": "x", "messages": HELLO, "max_tokens": 200, "stream": True, "logit_bias": NO_STOP}
    events: list[dict[str, object]] = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        for line in lines:
            if line.startswith("data: {") and "content" in line:
                break  # tokens are flowing: the engine process is mid-stream
        os.kill(before["pid"], signal.SIGKILL)
        killed_s = time.monotonic()
        for line in lines:
            if line.startswith("data: {"):
                events.append(json.loads(line.removeprefix("data: ")))
                if "error" in events[-1]:
                    failed_s = time.monotonic()
                    break
    error = events[-1]["error"]
    assert isinstance(error, dict) and set(error) == ERROR_KEYS and error["code"] == "engine_died", events[-1]
    assert failed_s - killed_s < 1.0  # the death is noticed from the process's exit, not a timeout
    refused = _chat(server)  # the new engine process is still importing torch: nothing serves yet
    assert refused.status_code == 503 and set(refused.json()["error"]) == ERROR_KEYS
    assert refused.json()["error"]["code"] == "engine_died"
    assert httpx.get(f"{server.url}/health", timeout=30).json() == {"status": "restarting"}
    server.wait_ready()  # /health turns 200 once the fresh engine process has loaded the model
    served = _chat(server)
    assert served.status_code == 200 and served.json()["choices"][0]["message"]["content"]
    after = _engine_process(server)
    assert after["pid"] != before["pid"] and after["restarts"] == 1
    if Path("/proc/self/task").is_dir():  # a restarted engine process does not inherit the HTTP thread's nice
        assert _nice(after["pid"]) == os.getpriority(os.PRIO_PROCESS, 0)


def test_sigterm_to_both_processes_drains_in_flight(tmp_path: Path) -> None:
    """A service manager stopping the whole group signals the engine process too: it leaves the drain to the
    API process, so the stream in flight still finishes."""
    model_dir = make_model_dir(tmp_path / "x")
    served = start_server(model_dir, tmp_path / "serve.log", "--placement", "single", "--grace-s", "60")
    served.wait_ready()
    engine_pid = _engine_process(served)["pid"]
    assert httpx.post(f"{served.url}/debug/step-delay", json={"seconds": 0.02}, timeout=30).status_code == 200
    body = {"model": "x", "messages": HELLO, "max_tokens": 60, "stream": True, "logit_bias": NO_STOP}
    finish = None
    with httpx.stream("POST", f"{served.url}/v1/chat/completions", json=body, timeout=60) as stream:
        for line in stream.iter_lines():
            if finish is None and line.startswith("data: {") and "content" in line:
                finish = "streaming"
                os.kill(engine_pid, signal.SIGTERM)
                served.process.send_signal(signal.SIGTERM)
            elif line.startswith("data: {"):
                finish = json.loads(line.removeprefix("data: "))["choices"][0]["finish_reason"] or finish
    assert finish == "length"
    assert served.process.wait(60) == 0
    assert "stagewise: drained" in (tmp_path / "serve.log").read_text()


def test_a_hung_engine_process_is_stopped_and_replaced(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path / "x")
    served = start_server(model_dir, tmp_path / "serve.log", "--placement", "single", "--step-timeout-s", "1")
    with serving(served):
        before = _engine_process(served)
        assert httpx.post(f"{served.url}/debug/step-delay", json={"seconds": 10}, timeout=30).status_code == 200
        hung = _chat(served)  # its step sleeps 10 s: the engine loop sends nothing meanwhile
        assert hung.status_code == 503 and set(hung.json()["error"]) == ERROR_KEYS
        assert hung.json()["error"]["code"] == "engine_died"
        assert "without progress (--step-timeout-s)" in hung.json()["error"]["message"]
        served.wait_ready()  # a fresh engine process (no step delay) serves
        assert _chat(served).status_code == 200
        after = _engine_process(served)
        assert after["pid"] != before["pid"] and after["restarts"] == 1
    assert "sent nothing for" in (tmp_path / "serve.log").read_text()
