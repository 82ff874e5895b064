"""OpenAI's Responses API (``/v1/responses``, stateless) through the openai client: text, reasoning items, function
calls and their outputs, structured output, streaming events (the client's own accumulator checks their order and
identities), and errors.

A scripted sampler stands in for the model's choices (:mod:`tests.test_server_tool_calls`); the rest is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI

from stagewise.engine.loaded_model import LoadedModel
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_anthropic import chatml  # noqa: F401  # the module-scoped models
from tests.test_server_reasoning import (
    THOUGHT,
    thinking,  # noqa: F401
)
from tests.test_server_tool_calls import CALL_TEXT, ScriptedBatcher, scripted_server

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture
def plain(chatml: LoadedModel) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:  # noqa: F811
    yield from scripted_server(chatml, ServeSettings(), "Hello there.")


@pytest.fixture
def tools(chatml: LoadedModel) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:  # noqa: F811
    yield from scripted_server(chatml, ServeSettings(), CALL_TEXT)


@pytest.fixture
def thinker(thinking: LoadedModel) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:  # noqa: F811
    yield from scripted_server(thinking, ServeSettings(), THOUGHT + "Paris.")


def test_text_response_and_usage(plain: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = plain
    response = client.responses.create(model="m", input="Capital of France?", instructions="Be brief.")
    assert response.id.startswith("resp_") and response.status == "completed" and response.object == "response"
    assert response.output_text == "Hello there."
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.input_tokens == len(scripted.prompts[-1])
    assert response.usage.output_tokens == len(scripted.ids)
    assert "Be brief." in scripted.last_prompt() and "Capital of France?" in scripted.last_prompt()
    cut = client.responses.create(model="m", input="Capital of France?", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_stream_builds_the_same_response(plain: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = plain
    whole = client.responses.create(model="m", input="Hi")
    with client.responses.stream(model="m", input="Hi") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == "completed"
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") > 1
    assert final.usage is not None and whole.usage is not None and final.usage.output_tokens == whole.usage.output_tokens


def test_reasoning_item_before_the_message(thinker: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = thinker
    response = client.responses.create(model="m", input="Capital of France?")
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "The user asks for the capital.\nIt is Paris."  # type: ignore[union-attr, index]
    assert response.output_text == "Paris."
    with client.responses.stream(model="m", input="Capital of France?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "message"] and final.output_text == "Paris."
    assert "response.reasoning_text.delta" in kinds


def test_function_call_and_its_output(tools: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = tools
    response = client.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])  # type: ignore[list-item]
    call = response.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    with client.responses.stream(model="m", input="Weather in Paris?", tools=[WEATHER]) as stream:  # type: ignore[list-item]
        final = stream.get_final_response()
    streamed = final.output[-1]
    assert streamed.type == "function_call" and json.loads(streamed.arguments) == {"city": "Paris"}
    follow_up = [{"role": "user", "content": "Weather in Paris?"},
                 {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": call.arguments},
                 {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}]
    client.responses.create(model="m", input=follow_up, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    rendered = scripted.last_prompt()
    assert "<tool_response>\n18 C\n</tool_response>" in rendered and '"city": "Paris"' in rendered
    forced = client.responses.create(model="m", input="Weather?", tools=[WEATHER],  # type: ignore[list-item]
                                     tool_choice={"type": "function", "name": "get_weather"})
    assert forced.output[-1].type == "function_call"


def test_json_schema_output(plain: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = plain
    scripted.ids = [*scripted.tokenizer.encode('{"a": 1}'), scripted.ids[-1]]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response = client.responses.create(model="m", input="JSON please", text={  # type: ignore[call-overload]
        "format": {"type": "json_schema", "name": "thing", "schema": schema}})
    assert json.loads(response.output_text) == {"a": 1}


def test_errors(plain: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = plain
    with pytest.raises(openai.BadRequestError) as stored:
        client.responses.create(model="m", input="Hi", previous_response_id="resp_abc")
    assert stored.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as tool:
        client.responses.create(model="m", input="Hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert tool.value.body["param"] == "tools.0.type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as image:
        client.responses.create(model="m", input=[{"role": "user", "content": [  # type: ignore[list-item]
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert "image input is not supported" in image.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.responses.create(model="m", input="word " * 2000)
    assert too_long.value.body["param"] == "input"  # type: ignore[index]
    assert client.responses.create(model="m", input="Hi", max_output_tokens=1).output is not None
