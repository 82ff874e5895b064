"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version``)
through Ollama's own client: streamed (its default) and not, thinking, tool calls, format, options, errors.

A scripted sampler stands in for the model's choices (:mod:`tests.test_server_tool_calls`); the rest is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import ollama
import pytest

from stagewise.engine.loaded_model import LoadedModel
from stagewise.server.serve_settings import ServeSettings
from tests.test_server_anthropic import chatml  # noqa: F401  # the module-scoped models
from tests.test_server_reasoning import THOUGHT, thinking  # noqa: F401
from tests.test_server_tool_calls import CALL_TEXT, TOOLS, ScriptedBatcher, scripted_server

KEY = "secret"
ASK = [{"role": "user", "content": "Capital of France?"}]


def _client(loaded: LoadedModel, text: str) -> Iterator[tuple[ollama.Client, ScriptedBatcher]]:
    for openai_client, scripted in scripted_server(loaded, ServeSettings(api_key=KEY), text):
        http = openai_client._client  # the in-process server's client (starlette's, over httpx2)
        http.headers["Authorization"] = f"Bearer {KEY}"
        client = ollama.Client(host="http://testserver")
        client._client = http  # NOTE: Ollama's client on it: its own httpx client cannot take httpx2's transport
        yield client, scripted


@pytest.fixture
def plain(chatml: LoadedModel) -> Iterator[tuple[ollama.Client, ScriptedBatcher]]:  # noqa: F811
    yield from _client(chatml, "Hello there, STOP here.")


@pytest.fixture
def tools(chatml: LoadedModel) -> Iterator[tuple[ollama.Client, ScriptedBatcher]]:  # noqa: F811
    yield from _client(chatml, CALL_TEXT)


@pytest.fixture
def thinker(thinking: LoadedModel) -> Iterator[tuple[ollama.Client, ScriptedBatcher]]:  # noqa: F811
    yield from _client(thinking, THOUGHT + "Paris.")


def test_chat_streamed_and_not(plain: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, scripted = plain
    raw = client._client.post("/api/chat", json={"model": "m", "messages": ASK})  # no "stream": Ollama streams
    lines = [json.loads(line) for line in raw.text.splitlines()]
    assert raw.headers["content-type"].startswith("application/x-ndjson") and len(lines) > 2 and lines[-1]["done"]
    reply = client.chat(model="m", messages=ASK, stream=False)
    assert reply.message.role == "assistant" and reply.message.content == "Hello there, STOP here."
    assert reply.done and reply.done_reason == "stop"
    assert reply.prompt_eval_count == len(scripted.prompts[-1]) and reply.eval_count == len(scripted.ids)
    assert reply.total_duration is not None and reply.total_duration >= (reply.eval_duration or 0) > 0
    chunks = list(client.chat(model="m", messages=ASK, stream=True))
    assert len(chunks) > 2 and all(not c.done for c in chunks[:-1]) and chunks[-1].done
    assert "".join(c.message.content or "" for c in chunks) == reply.message.content
    assert chunks[-1].eval_count == reply.eval_count


def test_options_and_generate(plain: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, scripted = plain
    short = client.chat(model="m", messages=ASK, stream=False, options={"num_predict": 2, "temperature": 0,
                                                                         "num_ctx": 8192, "repeat_penalty": 1.1})
    assert short.done_reason == "length" and short.eval_count == 2  # runner settings (num_ctx, ...) ignored
    stopped = client.chat(model="m", messages=ASK, stream=False, options={"stop": ["STOP"]})
    assert stopped.message.content == "Hello there, "
    generated = client.generate(model="m", prompt="Capital of France?", system="Be brief.", stream=False)
    assert generated.response == "Hello there, STOP here." and "Be brief." in scripted.last_prompt()
    raw = client.generate(model="m", prompt="Once upon", raw=True, stream=False)
    assert raw.response == "Hello there, STOP here." and scripted.last_prompt() == "Once upon"  # no template
    pieces = list(client.generate(model="m", prompt="Hi", stream=True))
    assert "".join(p.response for p in pieces) == generated.response and pieces[-1].done


def test_thinking(thinker: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, scripted = thinker
    reply = client.chat(model="m", messages=ASK, stream=False)
    assert reply.message.thinking == "The user asks for the capital.\nIt is Paris." and reply.message.content == "Paris."
    chunks = list(client.chat(model="m", messages=ASK, stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == reply.message.thinking
    assert "".join(c.message.content or "" for c in chunks) == "Paris."
    client.chat(model="m", messages=ASK, think=False, stream=False)
    assert scripted.last_prompt().endswith("<think>\n\n</think>\n\n")
    assert "thinking" in client.show("m").capabilities  # type: ignore[operator]


def test_tool_calls(tools: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, scripted = tools
    reply = client.chat(model="m", messages=ASK, tools=TOOLS, stream=False)
    calls = reply.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and calls[0].function.arguments == {"city": "Paris"}
    chunks = list(client.chat(model="m", messages=ASK, tools=TOOLS, stream=True))
    streamed = [call for c in chunks for call in (c.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == [("get_weather", {"city": "Paris"})]
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]
    client.chat(model="m", messages=history, tools=TOOLS, stream=False)
    assert "<tool_response>\n18 C\n</tool_response>" in scripted.last_prompt()
    assert "tools" in client.show("m").capabilities  # type: ignore[operator]


def test_format_json(plain: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, scripted = plain
    scripted.ids = [*scripted.tokenizer.encode('{"a": 1}'), scripted.ids[-1]]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert json.loads(client.chat(model="m", messages=ASK, format=schema, stream=False).message.content or "") == {"a": 1}
    assert json.loads(client.generate(model="m", prompt="x", format="json", stream=False).response) == {"a": 1}


def test_model_descriptions_and_errors(plain: tuple[ollama.Client, ScriptedBatcher]) -> None:
    client, _ = plain
    listed = client.list().models
    assert [m.model for m in listed] == ["m"] and (listed[0].size or 0) > 0
    assert [m.model for m in client.ps().models] == ["m"]
    shown = client.show("m")
    assert shown.modelinfo is not None and shown.template and "completion" in (shown.capabilities or [])
    http = client._client  # errors by hand: Ollama's client converts only httpx's errors, not httpx2's
    missing = http.post("/api/chat", json={"model": "qwen3:8b", "messages": ASK, "stream": False})
    assert missing.status_code == 404 and "qwen3:8b" in missing.json()["error"]
    image = http.post("/api/chat", json={"model": "m", "stream": False,
                                         "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]})
    assert image.status_code == 400 and image.json() == {"error": "image input is not supported"}
    denied = client._client.post("/api/chat", json={"model": "m", "messages": ASK},
                                 headers={"Authorization": "Bearer wrong"})
    assert denied.status_code == 401 and set(denied.json()) == {"error"}
    assert client.chat(model="m", messages=ASK, stream=False).done
