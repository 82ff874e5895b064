"""Tool calls in Qwen's XML format (Qwen3-Coder, Qwen3.5/3.6: ``<function=NAME>`` with ``<parameter=KEY>``
values) through the HTTP API: parsed and streamed with the offered tools' schemas, and forced by a grammar
(``tool_choice``) on a real random-weight model."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from openai import OpenAI

from stagewise.engine.loaded_model import LoadedModel
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_support import templated_model
from tests.test_server_tool_calls import ScriptedBatcher, scripted_server

XML_TEMPLATE = (  # Qwen3.5's shape, cut down: the tools and the XML call format in the system turn
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{- t.function.name + '\\n' }}"
    "{%- endfor %}{{- 'Call as <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n"
    "</function>\\n</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "book", "parameters": {
             "type": "object", "properties": {"zip": {"type": "string", "maxLength": 8}, "nights": {"type": "integer"}},
             "required": ["zip"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
CALL = ("Booking.\n<tool_call>\n<function=book>\n<parameter=zip>\n01234\n</parameter>\n<parameter=nights>\n2\n"
        "</parameter>\n</function>\n</tool_call>")
ASK = [{"role": "user", "content": "Book two nights."}]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    yield from templated_model(tmp_path_factory, "xml-tools", XML_TEMPLATE)


@pytest.fixture
def served(loaded: LoadedModel) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:
    yield from scripted_server(loaded, ServeSettings(), CALL)


def test_xml_calls_parsed_and_streamed_by_their_schemas(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    reply = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Booking."
    calls = choice.message.tool_calls
    assert calls is not None and calls[0].function.name == "book"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"zip": "01234", "nights": 2}  # type: ignore[union-attr]
    assert "<function=NAME>" in scripted.last_prompt()
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, stream=True))  # type: ignore[arg-type]
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas if d.id] == ["book"]  # type: ignore[union-attr]
    assert len(deltas) > 2  # the header, then the arguments a parameter at a time
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"zip": "01234", "nights": 2}  # type: ignore[union-attr]
    assert not any("<function" in (c.choices[0].delta.content or "") for c in chunks if c.choices)


@pytest.fixture
def random_weights(loaded: LoadedModel) -> Iterator[OpenAI]:
    from starlette.testclient import TestClient

    from stagewise.engine.engine import Engine
    from stagewise.server.app import guarded_app
    from stagewise.server.engine_front import LocalEngine
    from stagewise.server.server_state import ServerState

    engine = Engine(loaded).start()
    state = ServerState(ServeSettings())
    assert state.set_ready(LocalEngine(loaded, engine))
    with TestClient(guarded_app(state), base_url="http://testserver") as http:
        yield OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    engine.stop()


@pytest.mark.parametrize("seed", [1, 2])
def test_forced_xml_call_of_the_named_tool(random_weights: OpenAI, seed: int) -> None:
    reply = random_weights.chat.completions.create(
        model="m", messages=ASK, max_tokens=60, temperature=1.0, seed=seed, tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].function.name == "get_time"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) in ({"zone": "UTC"}, {"zone": "CET"})  # type: ignore[union-attr]


def test_required_xml_call_is_one_of_the_tools(random_weights: OpenAI) -> None:
    reply = random_weights.chat.completions.create(model="m", messages=ASK, max_tokens=60, temperature=0,  # type: ignore[arg-type]
                                                   tools=TOOLS, tool_choice="required")
    calls = reply.choices[0].message.tool_calls
    assert calls is not None and calls[0].function.name in ("book", "get_time")  # type: ignore[union-attr]
    arguments = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    if calls[0].function.name == "book":  # type: ignore[union-attr]
        assert set(arguments) <= {"zip", "nights"} and isinstance(arguments["zip"], str) and len(arguments["zip"]) <= 8
    else:
        assert arguments["zone"] in ("UTC", "CET")
