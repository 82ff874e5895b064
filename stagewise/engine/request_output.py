"""RequestOutput: what the engine reports for a request — text as it completes, then how it ended."""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.errors import StagewiseError

FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's text, raw bytes (its own, not its text's: a lone byte of a multi-byte
    character is that byte) and log-probability, with the top alternatives."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()  # (token, logprob, bytes)


@dataclass(frozen=True)
class RequestOutput:
    """One engine event for a request.

    ``text`` is newly completed output text (possibly empty: a character or a possible stop
    string is held back). The last event has ``finish_reason`` set: ``stop`` (EOS or a stop
    string), ``length``, ``cancelled`` or ``error`` (then ``error`` says why). Token counts are
    totals so far: ``completion_tokens`` counts every sampled token, EOS included.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    error: StagewiseError | None = None
    cached_tokens: int = 0  # of the prompt, positions served from the prefix cache (OpenAI's cached_tokens)
    stop_string: str | None = None  # the request's stop string that ended it (finish_reason "stop"; vLLM's stop_reason)

    def __post_init__(self) -> None:
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish_reason {self.finish_reason!r}")
        if (self.error is not None) != (self.finish_reason == "error"):
            raise ValueError("error is set exactly when finish_reason is 'error'")
        if self.stop_string is not None and self.finish_reason != "stop":
            raise ValueError("stop_string is set only when finish_reason is 'stop'")

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
