"""Anthropic's Messages API (``/v1/messages``) through Anthropic's own client: text, thinking, tool use, stop
sequences, streaming events, token counting and errors in Anthropic's shape.

A scripted sampler stands in for the model's choices (:mod:`tests.test_server_tool_calls`); the template, engine,
detokenizer, the reasoning and tool-call split and the client's own parsing of our events are real.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest
from openai import OpenAI

from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_reasoning import THOUGHT, thinking  # noqa: F401  # the thinking model, module-scoped here too
from tests.test_server_support import make_model_dir
from tests.test_server_tool_calls import CALL_TEXT, ScriptedBatcher, scripted_server

KEY = "secret"
ASK = [{"role": "user", "content": "Capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def chatml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("messages") / "m")), None, "single", 1024)
    yield model
    model.close()


def _blocks(content: list) -> list[dict]:
    """Content blocks as data (the streaming client returns its own subclasses of the blocks)."""
    return [b.model_dump(exclude={"parsed_output", "citations"}) for b in content]


def _client(loaded: LoadedModel, text: str) -> Iterator[tuple[anthropic.Anthropic, ScriptedBatcher]]:
    for openai_client, scripted in scripted_server(loaded, ServeSettings(api_key=KEY), text):
        http = openai_client._client  # the same in-process transport
        yield anthropic.Anthropic(base_url="http://testserver", api_key=KEY, http_client=http, max_retries=0), scripted


@pytest.fixture
def plain(chatml: LoadedModel) -> Iterator[tuple[anthropic.Anthropic, ScriptedBatcher]]:
    yield from _client(chatml, "Hello there, STOP here.")


@pytest.fixture
def tools(chatml: LoadedModel) -> Iterator[tuple[anthropic.Anthropic, ScriptedBatcher]]:
    yield from _client(chatml, CALL_TEXT)


@pytest.fixture
def thinker(thinking: LoadedModel) -> Iterator[tuple[anthropic.Anthropic, ScriptedBatcher]]:  # noqa: F811
    yield from _client(thinking, THOUGHT + "Paris.")


def test_text_message_and_its_usage(plain: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, scripted = plain
    message = client.messages.create(model="m", max_tokens=64, messages=ASK, system="Be brief.")  # type: ignore[arg-type]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello there, STOP here.")]  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens == len(scripted.prompts[-1]) and message.usage.output_tokens == len(scripted.ids)
    assert "Be brief." in scripted.last_prompt() and "Capital of France?" in scripted.last_prompt()


def test_stop_sequences_and_max_tokens(plain: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, _ = plain
    stopped = client.messages.create(model="m", max_tokens=64, messages=ASK, stop_sequences=["STOP", "zz"])  # type: ignore[arg-type]
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "STOP"
    assert stopped.content[0].text == "Hello there, "  # type: ignore[union-attr]
    cut = client.messages.create(model="m", max_tokens=2, messages=ASK)  # type: ignore[arg-type]
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_streamed_events_build_the_same_message(plain: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, _ = plain
    whole = client.messages.create(model="m", max_tokens=64, messages=ASK)  # type: ignore[arg-type]
    with client.messages.stream(model="m", max_tokens=64, messages=ASK) as stream:  # type: ignore[arg-type]
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "Hello there, STOP here."
    assert _blocks(final.content) == _blocks(whole.content) and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == whole.usage.output_tokens and final.usage.input_tokens == whole.usage.input_tokens


def test_thinking_block_apart(thinker: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, scripted = thinker
    message = client.messages.create(model="m", max_tokens=64, messages=ASK)  # type: ignore[arg-type]
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user asks for the capital.\nIt is Paris."  # type: ignore[union-attr]
    assert message.content[1].text == "Paris."  # type: ignore[union-attr]
    with client.messages.stream(model="m", max_tokens=64, messages=ASK) as stream:  # type: ignore[arg-type]
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert _blocks(final.content) == _blocks(message.content)
    assert kinds.count("content_block_start") == 2 and kinds[0] == "message_start" and kinds[-1] == "message_stop"
    scripted.ids = [*scripted.tokenizer.encode("Paris."), scripted.ids[-1]]
    client.messages.create(model="m", max_tokens=64, messages=ASK, thinking={"type": "disabled"})  # type: ignore[arg-type]
    assert scripted.last_prompt().endswith("<think>\n\n</think>\n\n")  # enable_thinking false


def test_tool_use_and_its_result(tools: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, scripted = tools
    message = client.messages.create(model="m", max_tokens=128, messages=ASK, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    assert message.stop_reason == "tool_use"
    text, call = message.content
    assert text.type == "text" and text.text == "Let me check."  # type: ignore[union-attr]
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}  # type: ignore[union-attr]
    with client.messages.stream(model="m", max_tokens=128, messages=ASK, tools=[WEATHER]) as stream:  # type: ignore[arg-type, list-item]
        streamed = stream.get_final_message()  # the client joins our input_json_delta pieces into the input
    assert streamed.content[1].input == {"city": "Paris"} and streamed.stop_reason == "tool_use"  # type: ignore[union-attr]
    assert "<tools>" in scripted.last_prompt()
    history = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": "get_weather",  # type: ignore[union-attr]
                                                         "input": {"city": "Paris"}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"},  # type: ignore[union-attr]
                                            {"type": "text", "text": "And tomorrow?"}]}]
    client.messages.create(model="m", max_tokens=8, messages=history, tools=[WEATHER])  # type: ignore[arg-type, list-item]
    rendered = scripted.last_prompt()
    assert "<tool_response>\n18 C\n</tool_response>" in rendered and '"city": "Paris"' in rendered
    assert rendered.index("18 C") < rendered.index("And tomorrow?")
    forced = client.messages.create(model="m", max_tokens=128, messages=ASK, tools=[WEATHER],  # type: ignore[arg-type, list-item]
                                    tool_choice={"type": "tool", "name": "get_weather"})
    assert forced.stop_reason == "tool_use" and forced.content[-1].type == "tool_use"


def test_count_tokens_is_the_prompt_the_engine_gets(tools: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, scripted = tools
    counted = client.messages.count_tokens(model="m", messages=ASK, tools=[WEATHER], system="Be brief.")  # type: ignore[arg-type, list-item]
    client.messages.create(model="m", max_tokens=4, messages=ASK, tools=[WEATHER], system="Be brief.")  # type: ignore[arg-type, list-item]
    assert counted.input_tokens == len(scripted.prompts[-1])


def test_errors_in_anthropics_shape(plain: tuple[anthropic.Anthropic, ScriptedBatcher]) -> None:
    client, _ = plain
    http = client._client
    missing = http.post("/v1/messages", json={"model": "m", "messages": ASK}, headers={"x-api-key": KEY})
    assert missing.status_code == 400
    body = missing.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        anthropic.Anthropic(base_url="http://testserver", api_key="wrong", http_client=http, max_retries=0
                            ).messages.create(model="m", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-nonesuch", max_tokens=4, messages=ASK)  # type: ignore[arg-type]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError, match="image input is not supported"):
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [image]}])  # type: ignore[list-item]
    with pytest.raises(anthropic.BadRequestError, match="prefill"):
        client.messages.create(model="m", max_tokens=4, messages=[*ASK, {"role": "assistant", "content": "Pa"}])  # type: ignore[list-item]
    with pytest.raises(anthropic.BadRequestError, match="stop_sequences allows at most 4"):
        client.messages.create(model="m", max_tokens=4, messages=ASK, stop_sequences=["a", "b", "c", "d", "e"])  # type: ignore[arg-type]
    assert client.messages.create(model="m", max_tokens=1, messages=ASK).content is not None  # type: ignore[arg-type]
    openai_shape = OpenAI(base_url="http://testserver/v1", api_key="wrong", http_client=http, max_retries=0)
    with pytest.raises(Exception) as other:
        openai_shape.models.list()
    assert other.value.body["code"] == "invalid_api_key"  # type: ignore[attr-defined]  # other routes keep OpenAI's
