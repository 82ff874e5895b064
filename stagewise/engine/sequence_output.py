"""SequenceOutput: turns one request's token events into text, stop-string cuts and logprobs."""

from __future__ import annotations

from stagewise.engine.generation_request import TokenEvent
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_output import RequestOutput, TokenLogprob
from stagewise.engine.stop_strings import StopMatcher
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import StagewiseError


class SequenceOutput:
    """Per-request output state: incremental detokenizer, stop matcher and token count."""

    def __init__(self, request: EngineRequest, tokenizer: Tokenizer) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.decoder = tokenizer.incremental_decoder(skip_special_tokens=True)
        self.matcher = StopMatcher(request.stop)
        self.completion_tokens = 0
        self.cached_tokens = 0  # the prefix cache's hit for its prompt (set by the engine)

    def add(self, event: TokenEvent) -> RequestOutput:
        """The output for one generated token; finished on EOS, a stop string or the length limit."""
        self.completion_tokens += 1
        token = event.sample.token
        text = "" if token in self.request.stop_token_ids else self.decoder.push(token)
        if event.finish_reason is not None:
            text += self.decoder.flush()
        emitted, stopped = self.matcher.push(text)
        logprobs = (self._logprob(event),) if self.request.logprobs else ()
        if stopped:
            return self._output(emitted, logprobs, "stop")
        if event.finish_reason is not None:
            return self._output(emitted + self.matcher.flush(), logprobs, event.finish_reason)
        return self._output(emitted, logprobs, None)

    def end(self, reason: str, error: StagewiseError | None = None) -> RequestOutput:
        """The last output when generation ends early (cancelled or failed)."""
        return RequestOutput("", self.request.prompt_tokens, self.completion_tokens, finish_reason=reason, error=error,
                             cached_tokens=self.cached_tokens)

    def _output(self, text: str, logprobs: tuple[TokenLogprob, ...], reason: str | None) -> RequestOutput:
        return RequestOutput(text, self.request.prompt_tokens, self.completion_tokens, logprobs, reason,
                             cached_tokens=self.cached_tokens, stop_string=self.matcher.matched)

    def _logprob(self, event: TokenEvent) -> TokenLogprob:
        sample = event.sample
        top = tuple((self._piece(t), lp, self._bytes(t)) for t, lp in sample.top)
        return TokenLogprob(self._piece(sample.token), sample.logprob, self._bytes(sample.token), top)

    def _bytes(self, token: int) -> tuple[int, ...]:
        return tuple(self.tokenizer.token_bytes(token))  # the token's own bytes, not its text's

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)
