"""A forced tool call cut off by max_tokens: ``tool_calls`` with the partial arguments and ``finish_reason:
length``, never raw ``<tool_call>`` text — parsing (unit) and through the API, streamed and not."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from starlette.testclient import TestClient

from stagewise.engine.cut_off_calls import cut_off_calls, forced_name
from stagewise.engine.engine import Engine
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import make_model_dir

HELLO = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"],
             "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
             "additionalProperties": False}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(("text", "forced", "name", "arguments"), [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', (), "get_weather", '{"city": "Par'),
    ('<tool_call>\n{"name": "get_wea', ("get_weather", "get_time"), "get_weather", ""),
    ('<tool_call>\n{"na', ("get_weather",), "get_weather", ""),
    ("<tool_c", ("get_weather",), "get_weather", ""),
])
def test_cut_off_hermes_call(text: str, forced: tuple[str, ...], name: str, arguments: str) -> None:
    parsed = cut_off_calls(text, "hermes", forced, random.Random(0))
    assert parsed.content is None
    assert [(c.name, c.arguments_json) for c in parsed.calls] == [(name, arguments)]


def test_cut_off_llama3_call_and_ambiguous_name() -> None:
    parsed = cut_off_calls('{"name": "get_time", "parameters": {"zone": "U', "llama3", ("get_time",), random.Random(0))
    assert [(c.name, c.arguments_json) for c in parsed.calls] == [("get_time", '{"zone": "U')]
    assert forced_name('<tool_call>\n{"name": "get_', ("get_weather", "get_time")) is None  # either one
    ambiguous = cut_off_calls('<tool_call>\n{"name": "get_', "hermes", ("get_weather", "get_time"), random.Random(0))
    assert ambiguous.calls == () and ambiguous.content is None  # no call can be named; the raw text is not content


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenAI]:
    loaded: LoadedModel = load_model(str(make_model_dir(tmp_path_factory.mktemp("cut-model") / "m")), None,
                                     "single", 1024)
    engine = Engine(loaded, max_waiting=32).start()
    state = ServerState(ServeSettings())
    assert state.set_ready(LocalEngine(loaded, engine))
    with TestClient(guarded_app(state), base_url="http://testserver") as http:
        yield OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    engine.stop()
    loaded.close()


def _full_call(client: OpenAI, tool_choice: Any) -> tuple[str, str, int]:
    """The uncut call's name, its arguments as the model wrote them (streamed raw), its token count."""
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, max_tokens=200, temperature=0,  # type: ignore[call-overload]
                                                 tools=TOOLS, tool_choice=tool_choice, stream=True,
                                                 stream_options={"include_usage": True}))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    raw = "".join(d.function.arguments or "" for d in deltas)
    return deltas[0].function.name, raw, chunks[-1].usage.completion_tokens


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_forced_call_cut_off_is_a_partial_call_finishing_length(client: OpenAI, tool_choice: Any) -> None:
    name, arguments, tokens = _full_call(client, tool_choice)
    partials: list[str] = []
    for max_tokens in sorted({1, 2, tokens // 4, tokens // 2, 3 * tokens // 4, tokens - 2}):
        kw: dict[str, Any] = dict(model="m", messages=HELLO, max_tokens=max_tokens, temperature=0, tools=TOOLS,
                                  tool_choice=tool_choice)
        reply = client.chat.completions.create(**kw)
        choice = reply.choices[0]
        if choice.finish_reason != "length":
            continue  # the call was complete within max_tokens
        assert choice.message.content is None, (max_tokens, choice.message.content)
        calls = choice.message.tool_calls or []
        chunks = list(client.chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "<tool_call>" not in text and not text.strip(), (max_tokens, text)
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        if not calls:  # cut before the name could tell get_weather from get_time: no call can be named
            assert tool_choice == "required" and deltas == [], max_tokens
        else:
            assert [c.function.name for c in calls] == [name], max_tokens
            partial = calls[0].function.arguments
            assert arguments.startswith(partial), (max_tokens, partial, arguments)
            assert deltas and deltas[0].function.name == name  # type: ignore[union-attr]
            assert "".join(d.function.arguments or "" for d in deltas) == partial  # type: ignore[union-attr]
            partials.append(partial)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == ["length"]
    assert any(p and p != arguments for p in partials), partials  # some cut fell inside the arguments
