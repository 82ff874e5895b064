"""GenerationRequest and TokenEvent: a token-level request and each token it produces."""

from __future__ import annotations

from dataclasses import dataclass, field

from stagewise.engine.sample import Sample
from stagewise.engine.sampling_params import SamplingParams
from stagewise.errors import RequestError

MAX_TOP_LOGPROBS = 20  # as OpenAI


@dataclass(frozen=True)
class GenerationRequest:
    """Token-level request: the prompt ids, how many tokens to generate, and how to sample."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("the prompt is empty")
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``finish_reason`` is set on the last one (``stop`` or ``length``)."""

    index: int
    sample: Sample
    finish_reason: str | None = None
