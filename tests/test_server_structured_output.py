"""Structured output through the HTTP API with a real random-weight model: response_format (json_object,
json_schema) and forced tool_choice (required, named), masked by an llguidance grammar in the Sampler."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from openai import OpenAI
from starlette.testclient import TestClient

from stagewise.engine.engine import Engine
from stagewise.engine.grammar import Grammar
from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import Sampler, SamplingParams
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import MODEL_VOCAB, make_model_dir

HELLO = [{"role": "user", "content": "Hello, world! How are you today?"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                            "maximum": 99},
                                           "tag": {"enum": ["red", "green", "blue"]}},
          "required": ["ok", "n", "tag"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
             "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("structured-model") / "m")), None, "single", 1024)  # served as "m"
    yield model
    model.close()


@pytest.fixture(scope="module")
def client(loaded: LoadedModel) -> Iterator[OpenAI]:
    engine = Engine(loaded, max_waiting=32).start()
    state = ServerState(ServeSettings())
    assert state.set_ready(LocalEngine(loaded, engine))
    with TestClient(guarded_app(state), base_url="http://testserver") as http:
        yield OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    engine.stop()


def _valid(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"ok", "n", "tag"} and isinstance(value["ok"], bool)
            and isinstance(value["n"], int) and 0 <= value["n"] <= 99 and value["tag"] in ("red", "green", "blue"))


def test_json_object(client: OpenAI) -> None:
    reply = client.chat.completions.create(model="m", messages=HELLO, max_tokens=100, temperature=0,  # type: ignore[arg-type]
                                           response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_json_schema_every_choice_valid(client: OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    reply = client.chat.completions.create(model="m", messages=HELLO, max_tokens=60, temperature=1.0, seed=4, n=4,  # type: ignore[arg-type]
                                           response_format=fmt)  # type: ignore[arg-type]
    values = [json.loads(c.message.content or "") for c in reply.choices]
    assert all(_valid(v) for v in values), values
    assert all(c.finish_reason == "stop" for c in reply.choices)
    streamed = client.chat.completions.create(model="m", messages=HELLO, max_tokens=60, temperature=0, stream=True,  # type: ignore[arg-type]
                                              response_format=fmt)  # type: ignore[arg-type]
    assert _valid(json.loads("".join(c.choices[0].delta.content or "" for c in streamed if c.choices)))
    text = client.completions.create(model="m", prompt="Answer:", max_tokens=60, temperature=0,
                                     extra_body={"response_format": fmt})
    assert _valid(json.loads(text.choices[0].text))


def test_named_tool_choice_is_a_call_of_that_tool(client: OpenAI) -> None:
    for seed in (1, 2):
        reply = client.chat.completions.create(model="m", messages=HELLO, max_tokens=100, temperature=1.0, seed=seed,  # type: ignore[arg-type]
                                               tools=TOOLS, tool_choice={"type": "function",  # type: ignore[arg-type]
                                                                         "function": {"name": "get_time"}})
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1 and calls[0].function.name == "get_time"  # type: ignore[union-attr]
        assert json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")  # type: ignore[union-attr]


def test_required_tool_choice_streams_a_call(client: OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, max_tokens=100, temperature=0,  # type: ignore[arg-type]
                                                 tools=TOOLS, tool_choice="required", stream=True))  # type: ignore[arg-type]
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function is not None and calls[0].function.name in ("get_weather", "get_time")
    arguments = json.loads("".join(tc.function.arguments or "" for tc in calls))  # type: ignore[union-attr]
    assert set(arguments) == ({"city"} if calls[0].function.name == "get_weather" else {"zone"})
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_structured_output_is_400(client: OpenAI, body: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=HELLO, max_tokens=4, **body)  # type: ignore[call-overload]
    assert info.value.body["param"] == param  # type: ignore[index]


def test_sampler_holds_the_grammar_state(loaded: LoadedModel) -> None:
    assert loaded.tokenizer is not None
    vocabulary = GrammarVocabulary.of(loaded.tokenizer, MODEL_VOCAB, loaded.stop_token_ids)
    grammar = Grammar.json_schema(SCHEMA, vocabulary, "test")
    sampler = Sampler(SamplingParams(temperature=0.0, grammar=grammar))
    assert not sampler.plain_greedy()  # the device-greedy path would bypass the mask
    assert not Sampler(SamplingParams(temperature=0.0, logit_bias=((5, 1.0),))).plain_greedy()
    logits = torch.zeros(MODEL_VOCAB)
    ids = []
    while not ids or ids[-1] not in loaded.stop_token_ids:
        ids.append(sampler.sample(logits).token)
    assert _valid(json.loads(loaded.tokenizer.decode(ids)))
    forced = Sampler(SamplingParams(temperature=0.0, grammar=grammar))
    first = forced.accept(loaded.tokenizer.encode("{")[0], -0.1)  # the device path's token advances it too
    assert first.token == loaded.tokenizer.encode("{")[0]
    assert loaded.tokenizer.decode([forced.sample(logits).token]).startswith('"')
