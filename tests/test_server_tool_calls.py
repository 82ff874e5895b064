"""Tool calls end to end through the HTTP API, with a scripted sampler standing in for the model's choices.

A random model will not emit a tool call, so every sequence the engine's batcher admits draws its
tokens from a sampler that replays a fixed text; everything else (template rendering with tools,
engine, batcher and pipeline steps, detokenizer, parser, OpenAI shapes, the openai client) is real.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from openai import OpenAI
from starlette.testclient import TestClient

from stagewise.engine.batcher import Batcher
from stagewise.engine.engine import Engine
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import Sample, Sampler, SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.server.app import guarded_app
from stagewise.server.engine_front import LocalEngine
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from tests.test_server_support import make_model_dir

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
CALL_TEXT = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class ScriptedSampler(Sampler):
    """Ignores the logits: draws ``ids`` in order (the last one is EOS)."""

    def __init__(self, params: SamplingParams, ids: list[int]) -> None:
        super().__init__(params)
        self.ids = ids
        self.drawn = 0

    def plain_greedy(self, top_logprobs: int = 0) -> bool:
        return False  # every token comes through sample()

    def sample(self, logits: torch.Tensor, top_logprobs: int = 0) -> Sample:
        token = self.ids[min(self.drawn, len(self.ids) - 1)]
        self.drawn += 1
        return Sample(token, -0.5)


class ScriptedBatcher(Batcher):
    """The engine's real batcher, with each admitted sequence sampling ``text`` then EOS; records the
    prompts it was given."""

    def __init__(self, engine: Engine, text: str) -> None:
        old = engine.batcher
        super().__init__(old.pipeline, old.max_context, old.prefill_chunk, old.micro_batches)
        self.tokenizer = engine.tokenizer
        self.ids = [*engine.tokenizer.encode(text), min(engine.stop_token_ids)]
        self.prompts: list[tuple[int, ...]] = []

    def add(self, sequence: Sequence) -> None:
        self.prompts.append(sequence.request.prompt_ids)
        sequence.sampler = ScriptedSampler(sequence.request.sampling, self.ids)
        super().add(sequence)

    def last_prompt(self) -> str:
        return self.tokenizer.decode(list(self.prompts[-1]), skip_special_tokens=False)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    model = load_model(str(make_model_dir(tmp_path_factory.mktemp("tool-model") / "m")), None, "single", 1024)  # served as "m"
    yield model
    model.close()


def scripted_server(loaded: LoadedModel, settings: ServeSettings, text: str) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:
    """An in-process server of ``loaded`` whose every sequence writes ``text``, and an openai client of it."""
    state = ServerState(settings)
    engine = Engine(loaded)
    scripted = ScriptedBatcher(engine, text)
    engine.batcher = scripted
    engine.start()
    assert state.set_ready(LocalEngine(loaded, engine))
    with TestClient(guarded_app(state), base_url="http://testserver") as http:
        yield OpenAI(base_url="http://testserver/v1", api_key=settings.api_key or "unused", http_client=http), scripted
    engine.stop()


@pytest.fixture
def served(loaded: LoadedModel) -> Iterator[tuple[OpenAI, ScriptedBatcher]]:
    yield from scripted_server(loaded, ServeSettings(api_key="secret"), CALL_TEXT)


def test_tool_calls_non_streaming(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                           tools=TOOLS)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert calls[0].id.startswith("call_")
    rendered = scripted.last_prompt()  # the template offered the tool
    assert "get_weather" in rendered and "<tools>" in rendered


def test_tool_calls_streaming(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = served
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                            tools=TOOLS, stream=True)  # type: ignore[arg-type]
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert [c.function.name for c in calls if c.id] == ["get_weather"]  # type: ignore[union-attr]
    arguments = "".join(c.function.arguments or "" for c in calls)  # type: ignore[union-attr]
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_leaves_text(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                           tools=TOOLS, tool_choice="none")  # type: ignore[arg-type]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    assert "<tools>" not in scripted.last_prompt()


def test_tool_result_round_trip_renders(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, scripted = served
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    client.chat.completions.create(model="m", tools=TOOLS, messages=[  # type: ignore[arg-type, list-item]
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ])
    rendered = scripted.last_prompt()
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in rendered
    assert '"city": "Paris"' in rendered


def test_tool_calls_stream_as_they_are_written(served: tuple[OpenAI, ScriptedBatcher]) -> None:
    client, _ = served
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Weather?"}],
                                                 tools=TOOLS, stream=True))  # type: ignore[arg-type]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    first_call = next(i for i, d in enumerate(deltas) if d.tool_calls)
    before = [d.content for d in deltas[:first_call] if d.content]
    assert len(before) > 1 and "".join(before) == "Let me check."  # content streamed before the call
    assert not any("tool_call" in (d.content or "") for d in deltas)
    header = deltas[first_call].tool_calls[0]  # type: ignore[index]
    assert header.index == 0 and header.id and header.id.startswith("call_") and header.type == "function"
    assert header.function is not None and header.function.name == "get_weather"
    pieces = [tc for d in deltas[first_call + 1 :] for tc in (d.tool_calls or [])]
    assert len(pieces) > 1 and all(p.id is None and p.index == 0 for p in pieces)  # arguments in pieces
    arguments = (header.function.arguments or "") + "".join(p.function.arguments or "" for p in pieces)  # type: ignore[union-attr]
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
