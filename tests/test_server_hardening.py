"""Client input the server must answer with 400 (never 500), and work kept off the event loop.

In-process: the app over a small random model, driven through starlette's test client (one event
loop in a background thread, as under uvicorn).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from stagewise.engine.engine import Engine
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import make_model_dir

HELLO = [{"role": "user", "content": "Hello there"}]
CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
HANG_S = 120  # bounds a wait that only a hang would reach, never a measure of speed


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("hardening-model"))), None, "single", 256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def http(loaded: LoadedModel) -> Iterator[TestClient]:
    state = ServerState(ServeSettings())
    engine = Engine(loaded).start()
    assert state.set_ready(LocalEngine(loaded, engine))
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
    # a message without content, as OpenAI refuses it (an assistant's tool_calls stand for its content)
    (CHAT, '{"messages": [{"role": "user"}]}', "messages.0.content"),
    (CHAT, '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": null}]}',
     "messages.1.content"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null}]}',
     "messages.1.content"),
    (CHAT, '{"messages": [{"role": "tool", "tool_call_id": "c1"}]}', "messages.0.content"),
]
# JSON text is UTF-8 without a byte-order mark (RFC 8259); json.loads alone would take these
_NOT_UTF8 = [b'\xef\xbb\xbf{"prompt": "hi", "max_tokens": 1}', '{"prompt": "hi", "max_tokens": 1}'.encode("utf-16"),
             '{"prompt": "hi", "max_tokens": 1}'.encode("utf-16-le")]


@pytest.mark.parametrize("raw", _NOT_UTF8, ids=["bom", "utf-16", "utf-16-le"])
def test_a_body_that_is_not_utf8_json_text_is_400(http: TestClient, raw: bytes) -> None:
    r = http.post(TEXT, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


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


def test_health_answers_while_a_huge_body_is_prepared(http: TestClient, loaded: LoadedModel,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a chat prompt this long is refused by its byte count, untokenized; /tokenize has no context to
    # bound it, so it tokenizes ~3.7 MB in a worker thread, held there until /health has answered
    refused = http.post(CHAT, json={"messages": [{"role": "user", "content": "word " * 750_000}], "max_tokens": 2})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert loaded.tokenizer is not None
    encode = loaded.tokenizer.encode
    tokenizing, may_finish, finished = threading.Event(), threading.Event(), threading.Event()

    def held_encode(text: str, add_special_tokens: bool = False) -> list[int]:
        tokenizing.set()
        may_finish.wait(HANG_S)  # a bound on a hang only: /health releases it long before
        return encode(text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(loaded.tokenizer, "encode", held_encode)
    result: dict[str, Any] = {}

    def post() -> None:
        result["response"] = http.post("/tokenize", json={"content": "word " * 750_000})  # ~3.7 MB
        finished.set()

    worker = threading.Thread(target=post)
    worker.start()
    assert tokenizing.wait(HANG_S), "the /tokenize body never reached the tokenizer"
    health = http.get("/health")
    answered_while_tokenizing = not finished.is_set()
    may_finish.set()
    worker.join()
    assert health.status_code == 200
    assert answered_while_tokenizing  # /health did not wait for the tokenizing (it is off the event loop)
    assert result["response"].status_code == 200
    assert result["response"].json()["count"] > 256  # far past the 256-token context
