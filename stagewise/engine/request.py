"""EngineRequest: what the engine runs for one client request, already tokenized and validated."""

from __future__ import annotations

from dataclasses import dataclass, field

from stagewise.engine.generator import GenerationRequest
from stagewise.engine.sampling import SamplingParams
from stagewise.errors import RequestError

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class EngineRequest:
    """A tokenized request.

    ``stop`` strings are matched on the decoded text and never appear in the output;
    ``stop_token_ids`` end generation when sampled (EOS); ``logprobs`` asks for the chosen
    token's log-probability and ``top_logprobs`` alternatives per generated token.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("the prompt is empty")
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise RequestError(f"stop allows at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    def generation(self) -> GenerationRequest:
        """The token-level request the :class:`Generator` runs."""
        return GenerationRequest(
            prompt_ids=self.prompt_ids,
            max_tokens=self.max_tokens,
            sampling=self.sampling,
            stop_token_ids=self.stop_token_ids,
            top_logprobs=self.top_logprobs if self.logprobs else 0,
        )
