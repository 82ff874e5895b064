"""The API process builds what a first request would build lazily before it says ready: the first burst after
ready does not pay for the tokenizer's byte bound (0.67 s for a 248,320-id vocabulary on the 2-core machine;
a first 8-stream burst's TTFT p50 0.995 s against 0.17 s for the next, over HTTP)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from rich.console import Console

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.tokenizer import Tokenizer
from stagewise.server import runner
from stagewise.server.model_facts import ModelFacts
from stagewise.server.request_path_warm_up import warm_request_path
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from stagewise.weights.tokenizer_train import train_demo_tokenizer

VOCAB = 5000


def _facts(template: str | None = None) -> ModelFacts:
    backend = train_demo_tokenizer(600, pad_to=VOCAB)
    end = backend.token_to_id("<|im_end|>")
    tokenizer = Tokenizer(backend, eos_token_id=end, eos_token_ids=[end])
    return ModelFacts("warm", VOCAB, 256, frozenset({end}), tokenizer, ChatTemplate(template), 1, 1, {})


def test_warm_request_path_computes_the_byte_bound_before_any_request() -> None:
    facts = _facts()
    assert "max_token_bytes" not in vars(facts.tokenizer)  # a cached property: computed on first use
    assert warm_request_path(facts) is None
    assert "max_token_bytes" in vars(facts.tokenizer)


def test_a_template_that_refuses_the_warm_up_conversation_is_said_and_the_rest_is_warm() -> None:
    facts = _facts("{{ raise_exception('a system message comes first') }}")
    problem = warm_request_path(facts)
    assert problem is not None and "a system message comes first" in problem
    assert "max_token_bytes" in vars(facts.tokenizer)


class _Engine:
    """The engine process as ``runner._load`` sees it, started at once."""

    def __init__(self, settings: ServeSettings, on_phase: Any) -> None:
        self.facts = _facts()
        self.on_death: Any = None
        self.ready_with_bound: bool | None = None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_server_says_ready_only_after_the_request_path_is_warm(monkeypatch: Any) -> None:
    monkeypatch.setattr(runner, "EngineProcess", _Engine)
    monkeypatch.setattr(runner, "freeze_heap", lambda: None)
    state = ServerState(ServeSettings())
    original = state.set_ready

    def set_ready(engine: _Engine) -> bool:
        engine.ready_with_bound = "max_token_bytes" in vars(engine.facts.tokenizer)
        return original(engine)  # type: ignore[arg-type]

    monkeypatch.setattr(state, "set_ready", set_ready)
    runner._load(state, SimpleNamespace(should_exit=False), Console(file=None, quiet=True))  # type: ignore[arg-type]
    assert state.phase == "ready"
    assert state.engine is not None and state.engine.ready_with_bound is True  # type: ignore[attr-defined]
