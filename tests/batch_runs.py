"""Requests through a :class:`Batcher` at once, as the batching, paged-KV and worker tests drive it."""

from __future__ import annotations

from collections.abc import Callable

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError

Run = list[list[tuple[int, float]]]  # per request: (token, log-probability) in order
TokenHook = Callable[[int, int], None]  # (request index, tokens it has so far), e.g. to kill a worker
CancelRule = Callable[[int, int], bool]  # (request index, tokens it has so far) -> cancel it now


def run_batch(batcher: Batcher, requests: list[GenerationRequest], on_token: TokenHook | None = None,
              cancelled: CancelRule | None = None,
              each_iteration: Callable[[], None] | None = None) -> tuple[Run, list[StagewiseError | None]]:
    """Every request through ``batcher`` at once (as many in flight as it has rows); each request's
    tokens and its error (None if it ended normally). A token is never reported twice or skipped."""
    out: Run = [[] for _ in requests]
    errors: list[StagewiseError | None] = [None] * len(requests)

    def sink(i: int) -> Callable[[TokenEvent], bool]:
        def take(event: TokenEvent) -> bool:
            assert event.index == len(out[i])  # never a token twice, never one skipped
            out[i].append((event.sample.token, event.sample.logprob))
            if on_token is not None:
                on_token(i, len(out[i]))
            return True
        return take

    def failed(i: int) -> Callable[[StagewiseError], None]:
        def record(error: StagewiseError) -> None:
            errors[i] = error
        return record

    def stop(i: int) -> Callable[[], bool]:
        return lambda: cancelled is not None and cancelled(i, len(out[i]))

    for i, request in enumerate(requests):
        batcher.add(Sequence(request, sink(i), failed(i), stop(i)))
    while batcher.active:
        batcher.iterate()
        if each_iteration is not None:
            each_iteration()
    batcher.drain()
    return out, errors
