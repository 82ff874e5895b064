"""SamplingParams: how a request's tokens are drawn (OpenAI's fields, validated); no tensors, so the API
process builds and checks them without the engine's libraries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from stagewise.errors import RequestError

if TYPE_CHECKING:
    from stagewise.engine.grammar import Grammar


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI-style sampling parameters; ``temperature == 0`` is greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 (vLLM's spelling): off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100]) added to the logits
    grammar: Grammar | None = None  # structured output: only tokens that keep the output inside it

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise RequestError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise RequestError(f"top_k must be >= 1, or 0 or -1 for off, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        ids = [token for token, _ in self.logit_bias]
        if any(token < 0 for token in ids) or len(set(ids)) != len(ids):
            raise RequestError("logit_bias token ids must be distinct and >= 0")
        bad = next((bias for _, bias in self.logit_bias if not -100.0 <= bias <= 100.0), None)
        if bad is not None:
            raise RequestError(f"logit_bias values must be in [-100, 100], got {bad}")
