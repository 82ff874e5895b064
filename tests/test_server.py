"""``stagewise serve`` as a subprocess, driven by the real openai client and raw HTTP.

One server per placement (single stage; two stages on virtual CPU devices), shared by the module.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from tests.test_server_support import ServedModel, make_model_dir, serving, start_server

KEY = "test-key"
HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]
MAX_SEQS = 2  # sequence slots of the module's servers (continuous batching); --queue 1 waits behind them
NO_STOP = {"0": -100, "1": -100, "2": -100}  # logit_bias: the demo tokenizer's specials (EOS among them) never drawn
PLACEMENTS = {"single": ["--placement", "single"],
              "pipeline2": ["--devices", "cpu:2x2GiB", "--placement", "pipeline:2"]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("served-model") / "x")  # served as "x": the requests' model


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def server(request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServedModel]:
    log = tmp_path_factory.mktemp("log") / "serve.log"
    served = start_server(model_dir, log, *PLACEMENTS[request.param], "--queue", "1",
                          "--max-seqs", str(MAX_SEQS), api_key=KEY)
    with serving(served):
        yield served


@pytest.fixture
def client(server: ServedModel) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=30)


def _post(server: ServedModel, path: str, body: object, headers: dict[str, str] | None = None,
          timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers if headers is not None else server.headers,
                      timeout=timeout)


def _set_delay(server: ServedModel, seconds: float) -> None:
    assert _post(server, "/debug/step-delay", {"seconds": seconds}).status_code == 200


HANG_S = 120.0  # how long a wait on the server's state may take before the test calls it a hang (never a race)


def _wait_metric(server: ServedModel, name: str, want: float, timeout_s: float = HANG_S) -> None:
    """Wait until the server's metric ``name`` reads ``want`` (state, not time: ``timeout_s`` only catches a hang)."""
    deadline = time.monotonic() + timeout_s
    while server.metric(name) != want:
        assert time.monotonic() < deadline, f"{name} stayed at {server.metric(name)}, wanted {want}"
        time.sleep(0.02)


def _wait_metric_above(server: ServedModel, name: str, floor: float, timeout_s: float = HANG_S) -> None:
    """Wait until the server's metric ``name`` exceeds ``floor`` (see :func:`_wait_metric`)."""
    deadline = time.monotonic() + timeout_s
    while server.metric(name) <= floor:
        assert time.monotonic() < deadline, f"{name} stayed at {server.metric(name)}, wanted more than {floor}"
        time.sleep(0.02)


def test_health_models_and_placement(server: ServedModel, client: OpenAI, model_dir: Path) -> None:
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [model_dir.name]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "stagewise_device_memory_charge_bytes" in metrics


def test_chat_non_streaming_usage(client: OpenAI) -> None:
    reply = client.chat.completions.create(model="x", messages=HELLO, max_tokens=12, seed=7)  # type: ignore[arg-type]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 5
    assert 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 12


def test_chat_streaming_matches_non_streaming(client: OpenAI) -> None:
    kw = dict(model="x", messages=HELLO, max_completion_tokens=16, temperature=0)
    full = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]


def test_sse_wire_format_ends_with_done(server: ServedModel) -> None:
    body = {"messages": HELLO, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert "usage" not in json.loads(events[0][6:])  # only with stream_options.include_usage


def test_seed_reproducible(client: OpenAI) -> None:
    kw = dict(model="x", messages=HELLO, max_tokens=16, temperature=1.0, top_p=0.9, seed=1234)
    a = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stop_strings_streamed_and_not(client: OpenAI) -> None:
    kw = dict(model="x", messages=HELLO, max_tokens=30, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content  # type: ignore[call-overload]
    assert full and len(full) >= 10
    stop = full[6:9]
    cut = client.chat.completions.create(stop=[stop, "never-there"], **kw)  # type: ignore[call-overload]
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert (cut.choices[0].model_extra or {})["stop_reason"] == stop  # vLLM's field: which stop string
    assert (client.chat.completions.create(**kw).choices[0].model_extra or {})["stop_reason"] is None  # type: ignore[call-overload]
    streamed = list(client.chat.completions.create(stop=stop, stream=True, **kw))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == full[: full.index(stop)]
    finals = [c.choices[0] for c in streamed if c.choices and c.choices[0].finish_reason]
    assert [(f.model_extra or {}).get("stop_reason") for f in finals] == [stop]
    completion = client.completions.create(model="x", prompt="Hi", max_tokens=30, temperature=0)
    text = completion.choices[0].text
    assert len(text) >= 4
    cut_text = client.completions.create(model="x", prompt="Hi", max_tokens=30, temperature=0, stop=[text[2:4]])
    assert cut_text.choices[0].text == text[: text.index(text[2:4])]
    assert (cut_text.choices[0].model_extra or {})["stop_reason"] == text[2:4]


def test_logprobs_shape(client: OpenAI) -> None:
    reply = client.chat.completions.create(model="x", messages=HELLO, max_tokens=4, logprobs=True,  # type: ignore[arg-type]
                                           top_logprobs=3, temperature=0)
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob  # greedy picks the top token


def test_text_completions(client: OpenAI) -> None:
    reply = client.completions.create(model="x", prompt="The quick brown fox", max_tokens=6, temperature=0,
                                      logprobs=2)
    assert reply.object == "text_completion"
    assert reply.usage is not None and reply.usage.completion_tokens <= 6
    assert reply.choices[0].logprobs is not None
    streamed = client.completions.create(model="x", prompt="The quick brown fox", max_tokens=6, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == reply.choices[0].text


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"messages": HELLO, "n": 17}, "n", None),
        ({"messages": HELLO, "temperature": "hot"}, "temperature", None),
        ({"messages": HELLO, "max_tokens": 1.5}, "max_tokens", None),
        ({"messages": "hi"}, "messages", None),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role", None),
        ({"messages": HELLO, "temperature": 5}, "temperature", None),
        ({"messages": HELLO, "response_format": {"type": "xml"}}, "response_format", None),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages", None),
        ({"messages": HELLO, "max_tokens": 100000}, "messages", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "word " * 400}]}, "messages", "context_length_exceeded"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(server: ServedModel, body: dict[str, object], param: str,
                                              code: str | None) -> None:
    response = _post(server, "/v1/chat/completions", {**body, "unknown_field": 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if code is not None:
        assert error["code"] == code


def test_context_overflow_through_the_client(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "word " * 400}])
    assert info.value.code == "context_length_exceeded"


def test_not_json_and_too_large(server: ServedModel) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{not json", headers=server.headers)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    big = {"messages": [{"role": "user", "content": "x" * (5 * 2**20)}]}
    r = _post(server, "/v1/chat/completions", big)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_api_key_required(server: ServedModel) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = _post(server, "/v1/chat/completions", {"messages": HELLO}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200  # probes stay open


class _OpenStream:
    """A streamed chat request on a raw socket, read by a thread until :meth:`close` (the server sees a
    client that is there and reading; closing shuts the socket, which unblocks the reader)."""

    def __init__(self, server: ServedModel, body: dict[str, object], wait_for_head: bool = True) -> None:
        payload = json.dumps(body).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                "Content-Type: application/json\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in server.headers.items())
                + f"Content-Length: {len(payload)}\r\n\r\n")
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        self.sock.sendall(head.encode() + payload)
        self.received = b""
        self.status_code = 0  # not known without wait_for_head (a non-streamed answer comes at its end)
        while wait_for_head and b"\r\n\r\n" not in self.received:
            part = self.sock.recv(65536)
            assert part, "the server closed the connection before answering"
            self.received += part
        if wait_for_head:
            self.status_code = int(self.received.split(b" ", 2)[1])
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while part := self.sock.recv(65536):
                self.received += part
        except OSError:
            pass  # closed by the test

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(HANG_S)


def _fill_slots_and_queue(server: ServedModel) -> list[_OpenStream]:
    """Every sequence slot running a long stream, then one more waiting in the queue (--queue 1)."""
    body = {"messages": HELLO, "max_tokens": 200, "stream": True, "logit_bias": NO_STOP}  # runs for >= 20 s
    streams: list[_OpenStream] = []
    for _ in range(MAX_SEQS):
        streams.append(_OpenStream(server, body))
        assert streams[-1].status_code == 200
    _wait_metric(server, "stagewise_active_sequences", float(MAX_SEQS))
    streams.append(_OpenStream(server, body))
    assert streams[-1].status_code == 200
    _wait_metric(server, "stagewise_queue_depth", 1.0)
    return streams


def _close_and_settle(server: ServedModel, streams: list[_OpenStream]) -> None:
    """Close every open stream, drop the step delay, and wait until nothing runs or waits."""
    for s in streams:
        s.close()
    _set_delay(server, 0.0)
    _wait_metric(server, "stagewise_active_sequences", 0.0)
    _wait_metric(server, "stagewise_queue_depth", 0.0)


def test_queue_full_is_429_with_retry_after(server: ServedModel) -> None:
    _set_delay(server, 0.1)
    streams: list[_OpenStream] = []
    try:
        streams = _fill_slots_and_queue(server)
        assert server.metric("stagewise_active_sequences") == MAX_SEQS  # nothing finished meanwhile
        r = _post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert all(s.thread.is_alive() for s in streams)  # every stream still open and being read
    finally:
        _close_and_settle(server, streams)


def test_abandoned_queued_stream_frees_its_queue_slot(server: ServedModel) -> None:
    _set_delay(server, 0.1)
    streams: list[_OpenStream] = []
    try:
        streams = _fill_slots_and_queue(server)
        streams.pop().close()  # the queued one's client goes away before it ever ran
        _wait_metric(server, "stagewise_queue_depth", 0.0)  # it left the queue, though no slot came free
        body = {"messages": HELLO, "max_tokens": 200, "stream": True, "logit_bias": NO_STOP}
        streams.append(_OpenStream(server, body))
        assert streams[-1].status_code == 200, "the abandoned request kept its queue slot"
        _wait_metric(server, "stagewise_queue_depth", 1.0)
        assert server.metric("stagewise_active_sequences") == MAX_SEQS  # admitted to the queue, not run
    finally:
        _close_and_settle(server, streams)


def test_disconnect_mid_stream_frees_state(server: ServedModel) -> None:
    _set_delay(server, 0.05)  # 200 tokens would take 10 s
    before = server.metric('stagewise_requests_total{finish_reason="cancelled"}') if _has_cancelled(server) else 0
    try:
        # the end-of-sequence token never drawn: cancelled is the only way to end before 200 tokens
        body = {"messages": HELLO, "max_tokens": 200, "stream": True, "logit_bias": NO_STOP}
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
            assert server.metric("stagewise_state_slots_in_use") == 1.0
        _wait_metric(server, "stagewise_state_slots_in_use", 0.0)
        _wait_metric(server, "stagewise_active_sequences", 0.0)
        # cancelled, not run to its end: the 200 tokens it had left would have finished as "length"
        assert server.metric('stagewise_requests_total{finish_reason="cancelled"}') == before + 1
    finally:
        _set_delay(server, 0.0)


def test_disconnect_during_prefill_cancels(server: ServedModel) -> None:
    _set_delay(server, 2.0)  # every step, the prefill's first, takes two seconds: 200 tokens would take 400 s
    before = server.metric('stagewise_requests_total{finish_reason="cancelled"}') if _has_cancelled(server) else 0
    admitted = server.metric("stagewise_prompt_tokens_total")
    stream: _OpenStream | None = None
    try:
        # a non-streamed request: the client hears nothing until the whole answer; it leaves once the
        # engine took the request (its prompt counted), i.e. while the first step (the prefill) runs
        body = {"messages": HELLO, "max_tokens": 200, "logit_bias": NO_STOP}
        stream = _OpenStream(server, body, wait_for_head=False)
        _wait_metric_above(server, "stagewise_prompt_tokens_total", admitted)
        stream.close()
        _wait_metric(server, 'stagewise_requests_total{finish_reason="cancelled"}', before + 1)
        _wait_metric(server, "stagewise_state_slots_in_use", 0.0)
        assert b"HTTP/1.1 200" not in stream.received  # no answer ever came
    finally:
        if stream is not None:
            stream.close()
        _set_delay(server, 0.0)


def _has_cancelled(server: ServedModel) -> bool:
    try:
        server.metric('stagewise_requests_total{finish_reason="cancelled"}')
    except KeyError:
        return False
    return True


def test_failed_step_is_500_and_server_keeps_serving(server: ServedModel, client: OpenAI) -> None:
    expected = client.chat.completions.create(model="x", messages=HELLO, max_tokens=6, temperature=0)
    last_stage = max(int(line.split('stage="')[1].split('"')[0])
                     for line in httpx.get(f"{server.url}/metrics").text.splitlines()
                     if line.startswith("stagewise_device_memory_charge_bytes{"))
    armed = _post(server, "/debug/fail-next-step", {"stage": last_stage})
    assert armed.status_code == 200
    r = _post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 6})
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == "step_failed" and error["type"] == "server_error"
    again = client.chat.completions.create(model="x", messages=HELLO, max_tokens=6, temperature=0)
    assert again.choices[0].message.content == expected.choices[0].message.content


def test_metrics_count_tokens_and_timings(server: ServedModel) -> None:
    r = _post(server, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})
    assert r.status_code == 200
    usage = r.json()["usage"]
    logged = [line for line in server.log.read_text().splitlines() if f"request {r.json()['id']}:" in line]
    assert len(logged) == 1 and f"prompt {usage['prompt_tokens']} tokens" in logged[0]  # one INFO line a request
    assert f"completion {usage['completion_tokens']} tokens, TTFT " in logged[0]
    text = httpx.get(f"{server.url}/metrics").text
    assert server.metric("stagewise_generation_tokens_total") > 0
    assert server.metric("stagewise_prompt_tokens_total") > 0
    for name in ("stagewise_time_to_first_token_seconds_count", "stagewise_stage_step_seconds_count",
                 "stagewise_decode_tokens_per_second_count", 'stagewise_http_requests_total{endpoint="/health"'):
        assert name in text
    stages = {line.split('stage="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("stagewise_stage_step_seconds_count")}
    if len(stages) > 1:
        assert "stagewise_handoff_seconds_count" in text


def test_sigterm_drains_in_flight_and_exits_zero(model_dir: Path, tmp_path: Path) -> None:
    served = start_server(model_dir, tmp_path / "drain.log", "--placement", "single", "--grace-s", "60")
    served.wait_ready()
    _set_delay(served, 0.05)  # 160 tokens: 8 s at least, in flight through the whole drain check below
    result: dict[str, object] = {}

    def stream() -> None:
        client = OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0, timeout=HANG_S)
        chunks = list(client.chat.completions.create(model="x", messages=HELLO, max_tokens=160,  # type: ignore[call-overload]
                                                     stream=True, logit_bias=NO_STOP))
        result["finish"] = chunks[-1].choices[0].finish_reason
        result["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    worker = threading.Thread(target=stream)
    worker.start()
    _wait_metric(served, "stagewise_state_slots_in_use", 1.0)
    served.process.send_signal(15)
    deadline = time.monotonic() + HANG_S
    while httpx.get(f"{served.url}/health").status_code != 503:  # draining: health and new requests are 503
        assert time.monotonic() < deadline, "the server never began draining"
        time.sleep(0.02)
    r = _post(served, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    worker.join(HANG_S)
    assert result.get("finish") == "length", result
    assert served.process.wait(HANG_S) == 0
    log = (tmp_path / "drain.log").read_text()
    assert "stagewise: drained" in log and "model closed" in log  # all finished within the grace


def test_does_not_fit_exits_2_with_one_line(model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "nofit.log"
    served = start_server(model_dir, log, "--devices", "cpu:2x64KiB")
    assert served.process.wait(60) == 2
    errors = [line for line in log.read_text().splitlines() if line.startswith("stagewise: error:")]
    assert len(errors) == 1 and "Traceback" not in log.read_text()


def test_a_repeated_prompt_reports_its_cached_tokens(server: ServedModel, client: OpenAI) -> None:
    system = " ".join(f"rule {i}: answer briefly and cite the pipeline stage." for i in range(6))  # several blocks
    kw = dict(model="x", messages=[{"role": "system", "content": system}, *HELLO], max_completion_tokens=4,
              temperature=0)
    first = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    again = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert first.usage is not None and again.usage is not None
    prompt = again.usage.prompt_tokens
    assert prompt > 128
    cached = again.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached % 64 == 0 and prompt - 64 <= cached < prompt  # every full block but the last token's
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached  # type: ignore[union-attr]
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("stagewise_prefix_cache_hit_tokens_total", "stagewise_prefix_cache_queries_total",
                 "stagewise_stage_prefix_cache_blocks"):
        assert name in text, name
    hits = next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("stagewise_prefix_cache_hit_tokens_total"))
    assert hits >= 2 * cached
