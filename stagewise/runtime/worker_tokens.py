"""WorkerTokens: a greedy step's tokens, kept on the device of the worker that ran it.

A :class:`~stagewise.runtime.remote_pipeline.DistributedPipeline` whose every stage one worker runs (its entry
and its exit), over stages that hold no recurrent state, hands this record out as a greedy step's
``tokens`` (:class:`~stagewise.runtime.pipeline.StepHandle`): the batcher passes it back as the next
step's input over the same rows, which then travels as ``Run.tokens_of`` and reads the tokens where
they were sampled. So the next step is sent before the coordinator hears of this one, and the
worker's device does not wait for a round trip to the coordinator between steps (the in-process
pipeline's device tokens, across a process boundary).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerTokens:
    """The greedy tokens ``(rows, 1)`` of step ``step_id`` over state rows ``first_row ..``, held by the worker
    that ran it."""

    step_id: int
    first_row: int
    rows: int
