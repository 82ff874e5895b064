"""Generator: one sequence at a time through the batcher — the engine's one step path for ``run``,
``bench`` and tests that follow a single request.

A request becomes a :class:`~stagewise.engine.sequence.Sequence` of a :class:`Batcher` that this
generator owns (its own KV allocator over the pipeline's rows; no prefix cache, so repeated prompts
are computed every time, as a benchmark needs): its prompt is prefilled in packed steps of at most
``prefill_chunk`` tokens, then it decodes, greedy steps one token ahead of the host where the exit
is a CUDA device, exactly as when it is served beside others. Tokens are yielded as the batcher
reports them; a consumer that stops reading ends the sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError
from stagewise.runtime.executor import Executor

CancelCheck = Callable[[], bool]


class Generator:
    """Runs requests one at a time through a :class:`Batcher` over ``pipeline`` (contexts of
    ``max_context`` positions, prompts in packed steps of ``prefill_chunk`` tokens)."""

    def __init__(self, pipeline: Executor, max_context: int, prefill_chunk: int = 512) -> None:
        self.pipeline = pipeline
        self.batcher = Batcher(pipeline, max_context, prefill_chunk, prefix_cache=False)
        self.max_context = self.batcher.sequence_tokens
        self.prefill_chunk = prefill_chunk

    def check(self, request: GenerationRequest) -> None:
        """Raise the typed error ``request`` would fail with (too long, a token outside the vocabulary)."""
        self.batcher.check(request)

    def stream(self, request: GenerationRequest, cancel: CancelCheck | None = None) -> Iterator[TokenEvent]:
        """Yield ``request``'s tokens as they are decided. Raises the step's typed error
        (:class:`~stagewise.errors.StepCancelled` when ``cancel`` says so, ``StepFailed`` …): the
        steps it ran are rolled back and the batcher is ready for the next request."""
        events: deque[TokenEvent] = deque()
        errors: list[StagewiseError] = []

        def take(event: TokenEvent) -> bool:
            events.append(event)
            return True

        seq = Sequence(request, take, errors.append, cancel or (lambda: False))
        self.batcher.add(seq)
        try:
            while True:
                while events:
                    yield events.popleft()
                if errors:
                    raise errors[0]
                if seq.done:
                    return
                self.batcher.iterate()
        finally:
            if not seq.done:  # the consumer stopped reading (or an error escaped): end it, collect the rest
                self.batcher.sched.end(seq)
            self.batcher.drain()
