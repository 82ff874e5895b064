"""Client input the server must answer with 400 (never 500), and work kept off the event loop.

In-process: the app over a small random model, driven through starlette's test client (one event
loop in a background thread, as under uvicorn).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from stagewise.engine.engine import Engine
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.server.app import guarded_app
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import make_model_dir

HELLO = [{"role": "user", "content": "Hello there"}]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("hardening-model"))), None, "single", 256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def http(loaded: LoadedModel) -> Iterator[TestClient]:
    state = ServerState(ServeSettings())
    engine = Engine(loaded).start()
    assert state.set_ready(loaded, engine)
    with TestClient(guarded_app(state), base_url="http://testserver", raise_server_exceptions=False) as client:
        yield client
    engine.stop()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (endpoint, raw JSON body, param named in the error or None)
_BAD: list[tuple[str, str, str | None]] = [
    (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages.0.content"),
    (TEXT, '{"prompt": "a\\udfffb"}', "prompt"),
    (CHAT, '{"messages": [{"role": "assistant", "content": null, "tool_calls": {"id": 1}}]}', "messages.0.tool_calls"),
    (CHAT, '{"messages": [{"role": "assistant", "content": null, "tool_calls": "call"}]}', "messages.0.tool_calls"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + "9" * 5000 + "}", None),
    (TEXT, '{"prompt": "hi", "max_tokens": ' + "9" * 5000 + "}", None),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"' + "1" * 5000 + '": 1}}', "logit_bias"),
    (CHAT, '{"messages": ' + _nested(100_000) + "}", None),
    (TEXT, '{"prompt": "hi", "stop": ' + _nested(100_000) + "}", None),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "seed": -9223372036854775809}', "seed"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616}', "seed"),
    (TEXT, '{"prompt": "hi", "seed": ' + "9" * 40 + "}", "seed"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "seed": 18446744073709551616, "stream": true}', "seed"),
    (TEXT, '{"prompt": "hi", "seed": -' + "9" * 40 + ', "stream": true}', "seed"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "n": ' + "9" * 30 + "}", "n"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": ' + "9" * 30 + "}",
     "top_logprobs"),
]


@pytest.mark.parametrize(("path", "raw", "param"), _BAD, ids=[f"{i}-{'chat' if p == CHAT else 'text'}" for i, (p, _, _) in enumerate(_BAD)])
def test_bad_input_is_400_in_openai_shape(http: TestClient, path: str, raw: str, param: str | None) -> None:
    r = http.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")  # not a 200 stream that fails later
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"] and "\n" not in error["message"]
    if param is not None:
        assert error["param"] == param
    ok = http.post(path, json={"messages": HELLO, "max_tokens": 2} if path == CHAT else {"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200, ok.text  # still serving


@pytest.mark.parametrize("path", [CHAT, TEXT])
@pytest.mark.parametrize("fields", [{"temperature": 1e-300}, {"temperature": 5e-324, "top_p": 1e-300},
                                    {"top_p": 5e-324}, {"temperature": 1e-6, "top_k": 1}])
def test_tiny_temperature_and_top_p_are_greedy(http: TestClient, path: str, fields: dict[str, Any]) -> None:
    base: dict[str, Any] = {"messages": HELLO} if path == CHAT else {"prompt": "Hello there"}
    greedy = http.post(path, json={**base, "max_tokens": 8, "temperature": 0})
    tiny = http.post(path, json={**base, "max_tokens": 8, **fields})
    assert greedy.status_code == 200 and tiny.status_code == 200, tiny.text
    key = "message" if path == CHAT else "text"
    pick = (lambda r: r.json()["choices"][0]["message"]["content"]) if key == "message" else (
        lambda r: r.json()["choices"][0]["text"])
    if "temperature" in fields:
        assert pick(tiny) == pick(greedy)  # below 1e-5 the temperature is greedy (as vLLM)


def test_health_answers_while_a_huge_body_is_prepared(http: TestClient) -> None:
    # a chat prompt this long is refused by its byte count, untokenized; /tokenize has no context to
    # bound it, so it tokenizes ~3.7 MB (seconds) in a worker thread while /health keeps answering
    refused = http.post(CHAT, json={"messages": [{"role": "user", "content": "word " * 750_000}], "max_tokens": 2})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    body = {"content": "word " * 750_000}  # ~3.7 MB
    result: dict[str, Any] = {}

    def post() -> None:
        started = time.monotonic()
        result["response"] = http.post("/tokenize", json=body)
        result["seconds"] = time.monotonic() - started

    worker = threading.Thread(target=post)
    worker.start()
    latencies = []
    while worker.is_alive():
        started = time.monotonic()
        assert http.get("/health").status_code == 200
        latencies.append(time.monotonic() - started)
        time.sleep(0.02)
    worker.join()
    assert result["response"].status_code == 200
    assert result["response"].json()["count"] > 256  # far past the 256-token context
    assert len(latencies) >= 3, result["seconds"]  # the body took a while: /health was polled meanwhile
    assert max(latencies) < min(0.5, result["seconds"] / 2), (max(latencies), result["seconds"])
