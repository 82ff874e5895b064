"""Hostile requests against a real ``stagewise serve`` process (issue 31): each is a 4xx in OpenAI's shape
before anything is sent, names what is wrong with the request, and leaves the server serving."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.test_server_support import ServedModel, make_model_dir, start_server

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
HELLO = [{"role": "user", "content": "Hello there"}]
_LIBRARY_WORDS = ("<state>", "NoExtensionBias", "Parser", "lexer", "Too many items")
_PYTHON_NAMES = ("JSONDecodeError", "RecursionError", "TypeError", "ValueError", "KeyError", "Traceback")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModel]:
    root = tmp_path_factory.mktemp("hostile")
    server = start_server(make_model_dir(root / "model"), root / "serve.log", "--placement", "single",
                          "--header-timeout-s", "3", "--body-timeout-s", "2")
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()[-3000:]


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _assert_openai_400(r: httpx.Response, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == 400, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")  # not a 200 stream that fails later
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"] and "\n" not in error["message"]
    assert not any(word in error["message"] for word in _LIBRARY_WORDS + _PYTHON_NAMES), error["message"]
    if param is not None:
        assert error["param"] == param, error
    return dict(error)


def _still_serving(served: ServedModel) -> None:
    r = httpx.post(f"{served.url}{CHAT}", json={"messages": HELLO, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text


_CYCLES: list[dict[str, Any]] = [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"anyOf": [{"$ref": "#"}]},
    {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"type": "string", "pattern": "(("},  # the library's own refusal, cut to one line
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", _CYCLES, ids=[f"schema{i}" for i in range(len(_CYCLES))])
def test_unsatisfiable_schema_is_400_before_the_response(served: ServedModel, schema: dict[str, Any],
                                                         stream: bool) -> None:
    body = {"messages": HELLO, "max_tokens": 8, "stream": stream, "response_format": _schema_format(schema)}
    _assert_openai_400(httpx.post(f"{served.url}{CHAT}", json=body, timeout=60), "response_format")
    text = {"prompt": "hi", "max_tokens": 8, "stream": stream, "response_format": _schema_format(schema)}
    _assert_openai_400(httpx.post(f"{served.url}{TEXT}", json=text, timeout=60), "response_format")
    _still_serving(served)


def test_recursive_schema_with_a_way_out_is_served(served: ServedModel) -> None:
    schema = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
              "required": ["children"], "additionalProperties": False}
    body = {"messages": HELLO, "max_tokens": 80, "temperature": 0, "response_format": _schema_format(schema)}
    r = httpx.post(f"{served.url}{CHAT}", json=body, timeout=60)
    assert r.status_code == 200, r.text
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)


def test_parallel_huge_prompts_are_refused_by_bytes_without_stalling_a_stream(served: ServedModel) -> None:
    """Four 3.9 MB prompts (under the 4 MiB body limit) sent while a stream runs: each is refused as too
    long without being tokenized, and the stream's tokens keep coming."""

    huge = "word " * 780_000  # 3.9 MB, ~2.3 M tokens: seconds of tokenizing each
    bodies = [{"messages": [{"role": "user", "content": huge}], "max_tokens": 2}, {"prompt": huge, "max_tokens": 2}]
    refusals: list[httpx.Response] = []
    stream_body = {"messages": HELLO, "max_tokens": 60, "temperature": 0, "stream": True}
    chunks: list[str] = []
    sent = threading.Event()

    def refuse(i: int) -> None:
        sent.wait(60)
        path = CHAT if i % 2 == 0 else TEXT
        refusals.append(httpx.post(f"{served.url}{path}", json=bodies[i % 2], timeout=120))

    threads = [threading.Thread(target=refuse, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    with httpx.stream("POST", f"{served.url}{CHAT}", json=stream_body, timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: "):
                chunks.append(line)
                sent.set()  # the stream is running: now the huge prompts arrive
    for thread in threads:
        thread.join()
    assert chunks[-1] == "data: [DONE]"
    assert len(refusals) == 4
    for r in refusals:
        error = _assert_openai_400(r)
        assert error["code"] == "context_length_exceeded" and "bytes" in error["message"], error


@pytest.mark.parametrize("sent", [b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"])
def test_idle_and_partial_header_sockets_are_closed(served: ServedModel, sent: bytes) -> None:
    """A socket that sends nothing, or half its headers, is closed by the server (--header-timeout-s 3),
    not held forever; the wait is on the close itself (recv returns b""), bounded generously."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        sock.sendall(sent)
        assert sock.recv(1024) == b""  # closed by the server, with no response
    _still_serving(served)


def test_keep_alive_connection_with_a_late_partial_request_is_closed(served: ServedModel) -> None:
    """After a complete response on a keep-alive connection, half of a second request's headers are not
    held open either."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.endswith(b"}"):
            chunk = sock.recv(4096)
            assert chunk, reply
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
        assert sock.recv(1024) == b""


def _trickle(sock: socket.socket, done: threading.Event) -> None:
    """Send the body one space at a time, paced, until the server closes the connection (or ``done``)."""
    while not done.wait(0.2):  # the pace of the trickle; nothing waits on it
        try:
            sock.sendall(b" ")
        except OSError:
            return


def _read_to_close(sock: socket.socket) -> bytes:
    reply = b""
    while chunk := sock.recv(4096):  # b"": the server closed the connection (the socket's timeout bounds a hang)
        reply += chunk
    return reply


def _trickled_reply(served: ServedModel, start: bytes) -> bytes:
    """Send ``start`` (headers and a first byte of body), then trickle the body until the server closes:
    everything it answered."""
    done = threading.Event()
    with socket.create_connection(("127.0.0.1", served.port), timeout=60) as sock:
        sock.sendall(start)
        trickler = threading.Thread(target=_trickle, args=(sock, done))
        trickler.start()
        try:
            return _read_to_close(sock)
        finally:
            done.set()
            trickler.join()


@pytest.mark.parametrize("path", [CHAT, TEXT, "/tokenize"])
def test_a_trickled_body_is_cut_off_with_408(served: ServedModel, path: str) -> None:
    """Headers, then a body trickled one byte at a time (slowloris on the body): the server answers 408 in
    OpenAI's shape once --body-timeout-s (2 s) has passed since it began reading, and closes the
    connection, however long the client would go on."""
    reply = _trickled_reply(served, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                     "Content-Length: 100000\r\n\r\n{\"messages\": ".encode())
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:300]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "request_timeout", error
    assert "--body-timeout-s" in error["message"] and "\n" not in error["message"]
    _still_serving(served)


def test_a_body_trickled_to_a_route_that_reads_none_is_not_held(served: ServedModel) -> None:
    """A body after GET /health headers: the answer comes at once and the connection is closed with it,
    not kept alive for the rest of a body that may never end."""
    reply = _trickled_reply(served, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b'{"status":"ok"}'), reply[:300]
    _still_serving(served)


_BAD_BODIES: list[tuple[str, str | None]] = [
    ('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {}}]}',
     "tools.0.function.name"),
    ('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": ""}}]}',
     "tools.0.function.name"),
    ('{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", '
     '"tools": [{"type": "function", "function": {"parameters": {}}}]}', "tools.0.function.name"),
    ('{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
     '"function": {"name": "f", "parameters": []}}]}', "tools.0.function.parameters"),
    ('{"messages": [{"role": "user", "content": "hi"}], "x\\ud800y": 1}', None),
    ('{"messages": [{"role": "user", "content": "hi"}], "unknown": {"k\\udfff": 1}}', None),
    ('{"messages": [{"role": "user", "content": "hi"}], "unknown": "\\ud800"}', "unknown"),
]


@pytest.mark.parametrize(("raw", "param"), _BAD_BODIES, ids=[f"body{i}" for i in range(len(_BAD_BODIES))])
def test_malformed_tools_and_surrogate_keys_are_400(served: ServedModel, raw: str, param: str | None) -> None:
    for stream in ("false", "true"):
        body = raw[:-1] + f', "max_tokens": 2, "stream": {stream}}}'
        r = httpx.post(f"{served.url}{CHAT}", content=body.encode(), headers={"Content-Type": "application/json"},
                       timeout=60)
        _assert_openai_400(r, param)


@pytest.mark.parametrize("raw", [b'{"messages": [', b'\xff\xfe{"messages": []}', b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                 b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", b"[1, 2]", b'{"a": 1,}'],
                         ids=["truncated", "not-utf8", "deep", "long-int", "array", "trailing-comma"])
def test_error_messages_name_the_problem_not_the_exception(served: ServedModel, raw: bytes) -> None:
    r = httpx.post(f"{served.url}{TEXT}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    _assert_openai_400(r)  # no JSONDecodeError, RecursionError, ValueError in the message


def test_template_errors_say_what_is_wrong() -> None:
    from stagewise.engine.chat_template import ChatTemplate
    from stagewise.errors import RequestError

    for source in ("{{ messages[0]['content'] + 1 }}", "{{ range(1, 2, 0) | list }}"):  # TypeError, ValueError
        with pytest.raises(RequestError) as info:
            ChatTemplate(source).render([{"role": "user", "content": "x"}])
        message = str(info.value)
        assert "\n" not in message and not any(name in message for name in _PYTHON_NAMES), message
