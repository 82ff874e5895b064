"""ModelFacts: what the API process knows of the served model — the text side and the plan, no weights.

The API process tokenizes, renders chat templates and compiles grammars, so it holds the model's
tokenizer and template; the status endpoint shows the placement view, built once by whoever holds the
loaded model (the engine process, or this process in the in-process tests) and read here as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # NOTE: not at run time: the API process imports no torch
    from stagewise.engine.loaded_model import LoadedModel


@dataclass(frozen=True)
class ModelFacts:
    """The served model as the HTTP side sees it.

    ``stages``: pipeline stages (fault injection's range, the status endpoint's rows); ``slots``: sequences
    decoded at once; ``placement``: :func:`~stagewise.server.placement_view.placement_view`'s body."""

    name: str
    vocab_size: int
    max_context: int
    stop_token_ids: frozenset[int]
    tokenizer: Tokenizer
    chat_template: ChatTemplate
    stages: int
    slots: int
    placement: dict[str, Any]

    def __post_init__(self) -> None:
        if self.vocab_size < 1 or self.max_context < 1 or self.stages < 1 or self.slots < 1:
            raise ValueError(f"model facts need positive sizes: vocab {self.vocab_size}, context "
                             f"{self.max_context}, stages {self.stages}, slots {self.slots}")

    @classmethod
    def of(cls, model: LoadedModel, slots: int) -> ModelFacts:
        """The facts of a loaded ``model`` whose engine decodes ``slots`` sequences at once."""
        # NOTE: imported here: the placement is read where the model is loaded (torch); the API process,
        # which receives the facts as a message, imports no torch (tests/test_api_imports.py)
        from stagewise.server.placement_view import placement_view

        if model.tokenizer is None:
            raise ValueError(f"model {model.name} has no tokenizer; serving needs one")
        return cls(model.name, model.config.vocab_size, model.max_context, model.stop_token_ids, model.tokenizer,
                   model.chat_template, len(model.pipeline.stages), slots, placement_view(model))
