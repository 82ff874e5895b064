"""The API surface beyond completions, in-process with a real (random-weight) model and engine:
model cards, tokenize/detokenize, CORS, request ids, logit_bias, n, top_k, default max_tokens.

Driven through the openai client (over Starlette's test transport) and raw HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from starlette.testclient import TestClient

from stagewise.engine.engine import Engine
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import MODEL_VOCAB, make_model_dir

KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("api-model") / "m")), None, "single", 256)  # served as "m"
    yield model
    model.close()


@pytest.fixture(scope="module")
def engine(loaded: LoadedModel) -> Iterator[Engine]:
    engine = Engine(loaded, max_waiting=32).start()
    yield engine
    engine.stop()


def _http(loaded: LoadedModel, engine: Engine, **settings: object) -> TestClient:
    state = ServerState(ServeSettings(api_key=KEY, **settings))  # type: ignore[arg-type]
    assert state.set_ready(LocalEngine(loaded, engine))
    return TestClient(guarded_app(state), base_url="http://testserver")


@pytest.fixture
def http(loaded: LoadedModel, engine: Engine) -> Iterator[TestClient]:
    with _http(loaded, engine) as client:
        yield client


@pytest.fixture
def client(http: TestClient) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=http, max_retries=0)


def _error(response: object, status: int, param: str | None) -> dict[str, object]:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    return error  # type: ignore[no-any-return]


# ----- GET /v1/models/{id} ---------------------------------------------------------------------
def test_model_card_and_unknown_model(client: OpenAI, loaded: LoadedModel) -> None:
    card = client.models.retrieve(loaded.name)
    assert card.id == loaded.name and card.object == "model" and card.owned_by == "stagewise"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.code == "model_not_found"
    assert info.value.body["param"] == "model"  # type: ignore[index]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_model_not_served_is_404_model_not_found(http: TestClient, loaded: LoadedModel, path: str,
                                                    stream: bool) -> None:
    body: dict[str, object] = {"max_tokens": 2, "stream": stream}
    body |= {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    error = _error(http.post(path, json={**body, "model": "gpt-4o"}, headers=AUTH), 404, "model")
    assert error["code"] == "model_not_found" and "gpt-4o" in str(error["message"])
    for served in (loaded.name, None):  # the served name, or no model at all (curl without one)
        fields = {**body, "model": served} if served is not None else body
        assert http.post(path, json=fields, headers=AUTH).status_code == 200


def test_a_model_not_served_through_the_client(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert info.value.code == "model_not_found"


def test_served_model_names_replace_the_defaults(loaded: LoadedModel, engine: Engine) -> None:
    with _http(loaded, engine, served_model_names=("team/llm", "llm")) as http:
        listed = http.get("/v1/models", headers=AUTH).json()["data"]
        assert [m["id"] for m in listed] == ["team/llm"]
        assert http.get("/v1/models/llm", headers=AUTH).json()["id"] == "team/llm"
        assert http.get("/v1/stagewise/status", headers=AUTH).json()["model"] == "team/llm"  # what the web page sends
        for asked, status in (("llm", 200), ("team/llm", 200), (None, 200), (loaded.name, 404)):
            body = {"prompt": "Hi", "max_tokens": 1} | ({"model": asked} if asked else {})
            r = http.post("/v1/completions", json=body, headers=AUTH)
            assert r.status_code == status, (asked, r.text)
            if status == 200:
                assert r.json()["model"] == "team/llm"  # responses carry the first name, as vLLM's


@pytest.mark.parametrize("route", ["/v1/embeddings", "/v1/audio/speech", "/v1/images/generations", "/v1/nothing"])
def test_a_route_not_served_is_404_in_openai_shape(http: TestClient, route: str) -> None:
    error = _error(http.post(route, json={"input": "x"}, headers=AUTH), 404, None)
    assert error["code"] == "not_found" and f"POST {route}" in str(error["message"])
    assert "/v1/chat/completions" in str(error["message"])
    error = _error(http.get("/v1/chat/completions", headers=AUTH), 405, None)
    assert error["code"] == "method_not_allowed" and "POST" in str(error["message"])


@pytest.mark.parametrize("stream", [False, True])
def test_completions_report_cached_tokens(client: OpenAI, stream: bool) -> None:
    prompt = f"{stream}: " + " ".join(f"rule {i}: answer briefly and cite the stage." for i in range(7))  # 2+ blocks
    kw = dict(model="m", prompt=prompt, max_tokens=2, temperature=0)
    first = client.completions.create(**kw)  # type: ignore[call-overload]
    assert first.usage is not None and first.usage.prompt_tokens > 128
    if stream:
        chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))  # type: ignore[call-overload]
        usage = chunks[-1].usage
    else:
        usage = client.completions.create(**kw).usage  # type: ignore[call-overload]
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached % 64 == 0 and usage.prompt_tokens - 64 <= cached < usage.prompt_tokens


# ----- /tokenize and /detokenize ---------------------------------------------------------------
def test_tokenize_detokenize_round_trip(http: TestClient, loaded: LoadedModel) -> None:
    text = "Hello, world! café 日本"
    assert loaded.tokenizer is not None
    for key in ("content", "prompt"):
        r = http.post("/tokenize", json={key: text}, headers=AUTH)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tokens"] == loaded.tokenizer.encode(text)
        assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    back = http.post("/detokenize", json={"tokens": body["tokens"]}, headers=AUTH)
    assert back.status_code == 200 and back.json()["content"] == text


def test_tokenize_messages_uses_the_chat_template(http: TestClient, loaded: LoadedModel) -> None:
    r = http.post("/tokenize", json={"messages": HELLO}, headers=AUTH)
    assert r.status_code == 200
    assert loaded.tokenizer is not None
    text = loaded.tokenizer.decode(r.json()["tokens"], skip_special_tokens=False)
    assert text.startswith("<|im_start|>user\nHello, world!") and text.endswith("<|im_start|>assistant\n")


def test_tokenize_and_detokenize_errors(http: TestClient) -> None:
    _error(http.post("/tokenize", json={}, headers=AUTH), 400, "content")
    _error(http.post("/tokenize", json={"content": "a", "prompt": "b"}, headers=AUTH), 400, "prompt")
    _error(http.post("/detokenize", json={"tokens": [1, MODEL_VOCAB]}, headers=AUTH), 400, "tokens.1")
    _error(http.post("/detokenize", json={"tokens": [-1]}, headers=AUTH), 400, "tokens.0")
    _error(http.post("/detokenize", json={"tokens": ["a"]}, headers=AUTH), 400, "tokens.0")
    assert http.post("/tokenize", json={"content": "a"}).status_code == 401  # behind the API key


# ----- CORS (opt-in) ---------------------------------------------------------------------------
PREFLIGHT = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def test_cors_off_by_default(http: TestClient) -> None:
    r = http.get("/v1/models", headers={**AUTH, "Origin": "http://app.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in http.options("/v1/chat/completions", headers=PREFLIGHT).headers


def test_cors_origin_allows_that_origin_only(loaded: LoadedModel, engine: Engine) -> None:
    with _http(loaded, engine, cors_origins=("http://app.example",)) as http:
        pre = http.options("/v1/chat/completions", headers=PREFLIGHT)  # no API key on a preflight
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        r = http.get("/v1/models", headers={**AUTH, "Origin": "http://app.example"})
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        denied = http.get("/v1/models", headers={**AUTH, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in denied.headers
        bad = http.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil.example"})
        assert bad.status_code == 400


def test_cors_origin_flag() -> None:
    from stagewise.cli.cmd_serve import settings_from_args
    from stagewise.cli.main import build_parser
    from stagewise.errors import ConfigError

    parse = build_parser().parse_args
    assert settings_from_args(parse(["serve"])).cors_origins == ()
    both = settings_from_args(parse(["serve", "--cors-origin", "http://a.example", "--cors-origin", "https://b:8443"]))
    assert both.cors_origins == ("http://a.example", "https://b:8443")
    with pytest.raises(ConfigError, match="cors-origin"):
        settings_from_args(parse(["serve", "--cors-origin", "http://a.example/path"]))


@pytest.mark.parametrize("flag", ["--header-timeout-s", "--body-timeout-s", "--keep-alive-s"])
def test_connection_timeout_flags(flag: str) -> None:
    from stagewise.cli.cmd_serve import settings_from_args
    from stagewise.cli.main import build_parser
    from stagewise.errors import ConfigError

    parse = build_parser().parse_args
    name = flag.removeprefix("--").replace("-", "_")
    assert getattr(settings_from_args(parse(["serve", flag, "7"])), name) == 7
    for bad in ("0", "-1", "3601"):
        with pytest.raises(ConfigError, match=f"{flag} must be in"):
            settings_from_args(parse(["serve", flag, bad]))


# ----- X-Request-Id ----------------------------------------------------------------------------
def test_request_id_echoed_and_used_as_completion_id(http: TestClient) -> None:
    body = {"messages": HELLO, "max_tokens": 2}
    r = http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Request-Id": "trace-42.a:b_c"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a:b_c"
    assert r.json()["id"] == "chatcmpl-trace-42.a:b_c"
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={**AUTH, "X-Request-Id": "t1"})
    assert r.json()["id"] == "cmpl-t1"
    fresh = http.post("/v1/chat/completions", json=body, headers=AUTH)
    rid = fresh.headers["x-request-id"]
    assert len(rid) == 32 and fresh.json()["id"] == f"chatcmpl-{rid}"
    assert http.get("/health").headers["x-request-id"]  # every response carries one
    assert http.post("/v1/chat/completions", json=body).headers["x-request-id"]  # errors too (401)


def test_request_id_streamed(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=HELLO, max_tokens=2, stream=True, extra_headers={"X-Request-Id": "stream-1"})  # type: ignore[arg-type]
    assert raw.headers["x-request-id"] == "stream-1"
    assert {chunk.id for chunk in raw.parse()} == {"chatcmpl-stream-1"}


@pytest.mark.parametrize("bad", ["x" * 129, "has space", "semi;colon", "a/b"])
def test_bad_request_id_is_400(http: TestClient, bad: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": HELLO}, headers={**AUTH, "X-Request-Id": bad})
    _error(r, 400, "X-Request-Id")


# ----- sampling fields -------------------------------------------------------------------------
def test_logit_bias_forces_and_bans_tokens(client: OpenAI, loaded: LoadedModel) -> None:
    assert loaded.tokenizer is not None
    word = loaded.tokenizer.token_to_id("ibonacci")
    assert word is not None
    forced = client.chat.completions.create(model="m", messages=HELLO, max_tokens=5, temperature=0,  # type: ignore[arg-type]
                                            logit_bias={str(word): 100})
    assert forced.choices[0].message.content == "ibonacci" * 5
    sampled = client.completions.create(model="m", prompt="Hello", max_tokens=4, temperature=1.0, seed=3,
                                        logit_bias={str(word): 100})
    assert sampled.choices[0].text == "ibonacci" * 4
    plain = client.completions.create(model="m", prompt="Hello", max_tokens=6, temperature=0, logprobs=0)
    first = plain.choices[0].logprobs.tokens[0]  # type: ignore[union-attr, index]
    banned = loaded.tokenizer.encode(first)
    assert len(banned) == 1
    avoided = client.completions.create(model="m", prompt="Hello", max_tokens=6, temperature=0, logprobs=0,
                                        logit_bias={str(banned[0]): -100})
    assert avoided.choices[0].logprobs.tokens[0] != first  # type: ignore[union-attr, index]


@pytest.mark.parametrize(("bias", "param"), [({str(MODEL_VOCAB): 1}, "logit_bias"), ({"-1": 1}, "logit_bias"),
                                             ({"abc": 1}, "logit_bias"), ({"5": 101}, "logit_bias"),
                                             ({"5": "x"}, "logit_bias")])
def test_bad_logit_bias_is_400(http: TestClient, bias: dict[str, object], param: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": HELLO, "logit_bias": bias}, headers=AUTH)
    _error(r, 400, param)


def test_top_k_minus_one_is_off(client: OpenAI) -> None:
    kw = dict(model="m", messages=HELLO, max_tokens=8, temperature=1.0, seed=11)
    off = client.chat.completions.create(extra_body={"top_k": -1}, **kw)  # type: ignore[call-overload]
    zero = client.chat.completions.create(extra_body={"top_k": 0}, **kw)  # type: ignore[call-overload]
    assert off.choices[0].message.content == zero.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(extra_body={"top_k": -2}, **kw)  # type: ignore[call-overload]
    assert info.value.body["param"] == "top_k"  # type: ignore[index]


def test_completions_default_max_tokens_is_16(client: OpenAI) -> None:
    reply = client.completions.create(model="m", prompt="Hello", temperature=0)
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model="m", messages=HELLO, temperature=0)  # type: ignore[arg-type]
    assert chat.usage is not None and chat.usage.completion_tokens > 16  # chat: the rest of the context


def test_logprobs_bytes_are_the_tokens_own(client: OpenAI, loaded: LoadedModel) -> None:
    assert loaded.tokenizer is not None
    lead = loaded.tokenizer.token_to_id("Ã")  # byte 0xC3 alone: the first half of a two-byte character
    reply = client.chat.completions.create(model="m", messages=HELLO, max_tokens=3, temperature=0, logprobs=True,  # type: ignore[arg-type]
                                           top_logprobs=2, logit_bias={str(lead): 100})
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and [e.bytes for e in content] == [[0xC3]] * 3
    assert all(e.top_logprobs[0].bytes is not None for e in content)


# ----- n > 1 -----------------------------------------------------------------------------------
def test_n_choices_with_derived_seeds(client: OpenAI) -> None:
    kw = dict(model="m", messages=HELLO, max_tokens=6, temperature=1.0)
    reply = client.chat.completions.create(n=3, seed=100, **kw)  # type: ignore[call-overload]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    for i in range(3):  # choice i samples as a single request seeded seed + i
        alone = client.chat.completions.create(seed=100 + i, **kw)  # type: ignore[call-overload]
        assert alone.choices[0].message.content == texts[i]
    assert len(set(texts)) > 1
    single = client.chat.completions.create(seed=100, **kw)  # type: ignore[call-overload]
    assert reply.usage is not None and single.usage is not None
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert reply.usage.completion_tokens == 18 == 3 * single.usage.completion_tokens


def test_n_choices_streamed(client: OpenAI) -> None:
    kw = dict(model="m", messages=HELLO, max_tokens=5, temperature=1.0, seed=5, n=2)
    full = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert mine[0].delta.role == "assistant"
        assert "".join(ch.delta.content or "" for ch in mine) == full.choices[index].message.content
        assert [ch.finish_reason for ch in mine if ch.finish_reason] == [full.choices[index].finish_reason]
    assert chunks[-1].usage is not None and full.usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_n_on_completions(client: OpenAI) -> None:
    reply = client.completions.create(model="m", prompt="Hello", max_tokens=4, temperature=0, n=2, logprobs=1)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text == reply.choices[1].text  # greedy: the same twice
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    streamed = list(client.completions.create(model="m", prompt="Hello", max_tokens=4, temperature=0, n=2,
                                              stream=True))
    for index in (0, 1):
        text = "".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == index)
        assert text == reply.choices[index].text


def test_a_batch_of_prompts_on_completions(client: OpenAI, http: TestClient) -> None:
    prompts = ["Hello", "A longer prompt than the first", "Third"]
    alone = [client.completions.create(model="m", prompt=p, max_tokens=3, temperature=0) for p in prompts]
    batch = client.completions.create(model="m", prompt=prompts, max_tokens=3, temperature=0, n=2)
    assert [c.index for c in batch.choices] == list(range(6))  # prompt * n + choice, as OpenAI orders them
    assert [c.text for c in batch.choices] == [a.choices[0].text for a in alone for _ in range(2)]  # greedy
    assert batch.usage is not None and all(a.usage is not None for a in alone)
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)  # type: ignore[union-attr]
    assert batch.usage.completion_tokens == 2 * sum(a.usage.completion_tokens for a in alone)  # type: ignore[union-attr]
    chunks = list(client.completions.create(model="m", prompt=prompts, max_tokens=3, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert texts == [a.choices[0].text for a in alone]
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == batch.usage.prompt_tokens
    ids = client.completions.create(model="m", prompt=[[5, 6, 7], [8, 9]], max_tokens=2, temperature=0)
    assert len(ids.choices) == 2 and ids.usage is not None and ids.usage.prompt_tokens == 5
    _error(http.post("/v1/completions", json={"prompt": ["ok", ""], "max_tokens": 2}, headers=AUTH), 400, "prompt.1")
    _error(http.post("/v1/completions", json={"prompt": ["a"] * 33, "n": 2}, headers=AUTH), 400, "n")
    _error(http.post("/v1/completions", json={"prompt": ["a"] * 65}, headers=AUTH), 400, "prompt")


@pytest.mark.parametrize("n", [0, 17])
def test_n_out_of_range_is_400(http: TestClient, n: int) -> None:
    _error(http.post("/v1/chat/completions", json={"messages": HELLO, "n": n}, headers=AUTH), 400, "n")
