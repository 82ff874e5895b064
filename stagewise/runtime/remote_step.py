"""RemoteStep: a step sent to the workers, settled (published or rolled back) when its result is asked for;
and what the acknowledgements of its :class:`Run` give back (the exit's output, every stage's timings)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from stagewise.errors import WorkerMessageRejected
from stagewise.models.stage_model import StageOutput
from stagewise.runtime.pipeline import CancelCheck, StepHandle, StepTimings
from stagewise.runtime.worker_messages import Ack


class RemoteStep(StepHandle):
    """Step ``step_id`` over ``rows``, sent as run ``seq``; ``settle`` collects, publishes or rolls it back
    (filling ``output`` or ``error``). ``greedy``: the exit sends each row's greedy pair only. ``reads``:
    the step whose kept tokens it took as input (``read_failed`` once that one was rolled back: then so
    is this one)."""

    def __init__(self, settle: Callable[[RemoteStep], None], seq: int, step_id: int, rows: frozenset[int],
                 cancel: CancelCheck | None, greedy: bool, reads: int | None = None) -> None:
        super().__init__()
        self.greedy = greedy
        self.reads = reads
        self.read_failed = False
        self._settle = settle
        self.seq = seq
        self.step_id = step_id
        self.rows = rows
        self.cancel = cancel
        self.settled = False

    def result(self) -> StageOutput:
        self._settle(self)
        return super().result()


def step_output(seq: int, greedy: bool, exit_ack: Ack) -> StageOutput:
    """The exit's output of run ``seq``, from the exit worker's acknowledgement: a greedy step's pairs only
    (its features stay in the worker: ``hidden`` is empty), else the features and, where the step has
    them, the logits. Raises :class:`WorkerMessageRejected` when what the step needs is missing."""
    if greedy:
        if not exit_ack.pairs:
            raise WorkerMessageRejected(f"run {seq}: the exit worker sent no greedy pairs")
        return StageOutput(torch.empty(0), None, torch.tensor(exit_ack.pairs, dtype=torch.float32))
    if exit_ack.hidden is None:
        raise WorkerMessageRejected(f"run {seq}: the exit worker sent no features")
    return StageOutput(exit_ack.hidden.tensor(), exit_ack.logits.tensor() if exit_ack.logits is not None else None)


def step_timings(owners: Sequence[int], acks: dict[int, Ack]) -> StepTimings:
    """Every stage's time and every boundary's handoff, in stage order, from the workers ``owners`` names."""
    timings = StepTimings()
    for rank in sorted(set(owners)):
        timings.stage_s.extend(acks[rank].stage_s)
        if rank != owners[0]:
            timings.handoff_s.append(acks[rank].handoff_s)
    return timings
