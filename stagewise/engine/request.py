"""EngineRequest: what the engine runs for one client request, already tokenized and validated."""

from __future__ import annotations

from dataclasses import dataclass, field

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.sampling_params import SamplingParams
from stagewise.errors import RequestError

MAX_STOP_STRINGS = 4  # as OpenAI


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
        # the token-level checks (prompt, max_tokens, top_logprobs) are GenerationRequest's own
        GenerationRequest(self.prompt_ids, self.max_tokens, self.sampling, self.stop_token_ids, self.top_logprobs)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise RequestError(f"stop allows at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty")

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
