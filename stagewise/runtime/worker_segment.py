"""WorkerSegment: the contiguous stages one worker process owns, with its two distributed ends.

A segment runs one step through the same loop as the in-process :class:`Pipeline`
(:class:`~stagewise.runtime.segment.Segment`) over its stages — receive the activation (or take the
tokens at the entry), run the loop, send the activation on (or keep the exit's output) — and leaves every stage's state provisional
until the coordinator says publish or rollback. Several steps over disjoint rows may be
provisional at once (the coordinator keeps one micro-batch per worker in flight); each is settled
by its step id, for the rows it ran. It rearranges state rows on command as the
in-process pipeline does (reset, KV blocks, moves), each checked against its stages'
rows and KV pool before any stage changes.

A segment that runs the entry and the exit keeps a greedy step's tokens (:meth:`keep_tokens`) for a
later run that names them (``Run.tokens_of``). That run may start before the step it reads from is
settled, over the same rows, where no stage holds recurrent state: attention state is written at the
run's own positions, so settling either step later changes nothing the other wrote (a recurrent row
has one entry to write while a step is unsettled, :class:`~stagewise.models.state_slots.StateSlots`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from stagewise.errors import StepFailed, WorkerMessageRejected
from stagewise.models.block_table import BlockTable
from stagewise.models.stage_model import StageOutput
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.channel import Channel, channel_for
from stagewise.runtime.distributed_channel import DistributedChannel
from stagewise.runtime.distributed_group import wire_device
from stagewise.runtime.handoff import Handoff
from stagewise.runtime.segment import Segment, SegmentStep
from stagewise.runtime.stage import Stage
from stagewise.runtime.tensor_blob import DTYPE_NAMES
from stagewise.runtime.worker_messages import Assignment, Move, Reset, Restore, RowOp, Run, SetBlocks
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.tensor_source import TensorSource

Opener = Callable[[str], tuple[ModelConfig, TensorSource]]  # model path -> (config, tensor source)
KEPT_STEPS = 8  # greedy steps whose tokens a segment keeps (one per micro-batch in flight is read)


@dataclass
class SegmentResult:
    """One step's outcome on this worker: the exit's output (last segment only) and timings."""

    output: StageOutput | None
    stage_s: list[float]
    handoff_s: float


class WorkerSegment:
    """Stages ``stages`` (in order) with ``inbound`` from the previous worker (``None`` at the
    entry) and ``outbound`` to the next one (``None`` at the exit)."""

    def __init__(self, stages: list[Stage], inbound: DistributedChannel | None,
                 outbound: DistributedChannel | None, hidden_size: int, vocab_size: int = 0,
                 context: int = 0, batch: int = 0) -> None:
        self.stages = stages
        self.inbound = inbound
        self.outbound = outbound
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size  # 0: unchecked
        self.context = context
        self.batch = batch
        local: list[Channel] = [channel_for(a.device, b.device, None) for a, b in itertools.pairwise(stages)]
        self.segment = Segment(stages, local, hidden_size)  # the one stage loop, as in process
        self.pending: dict[int, frozenset[int]] = {}  # step id -> the rows it ran, until published or rolled back
        self.kept: dict[int, torch.Tensor] = {}  # step id -> its greedy tokens (rows, 1), until a run reads them
        self.recurrent = any(stage.recurrent for stage in stages)

    @staticmethod
    def load(assignment: Assignment, opener: Opener) -> WorkerSegment:
        """Load only this worker's stages, each straight to its device, and allocate their state."""
        if not assignment.stages:
            return WorkerSegment([], None, None, 0)
        config, source = opener(assignment.model)
        dtype = DTYPE_NAMES[assignment.dtype]
        stages: list[Stage] = []
        try:
            for spec in assignment.stages:
                stage = Stage.load(spec, config, source, dtype)
                stage.allocate_state(assignment.batch, assignment.context, assignment.kv_blocks or None,
                                     assignment.snapshots)
                if assignment.cuda_graphs:
                    stage.enable_graphs(assignment.packed_tokens)  # a no-op off CUDA
                stages.append(stage)
        except BaseException:
            for stage in stages:
                stage.close()
            raise
        first, last = stages[0].device, stages[-1].device
        inbound = outbound = None
        if assignment.prev_rank >= 0:
            inbound = DistributedChannel(assignment.prev_rank, wire_device(assignment.backend, first), first)
        if assignment.next_rank >= 0:
            outbound = DistributedChannel(assignment.next_rank, wire_device(assignment.backend, last), last)
        return WorkerSegment(stages, inbound, outbound, config.hidden_size, config.vocab_size, assignment.context,
                             assignment.batch)

    def run(self, cmd: Run) -> SegmentResult:
        """Run step ``cmd.step_id``; on failure, send an ABORT downstream, then re-raise."""
        if not self.stages:
            return SegmentResult(None, [], 0.0)  # a worker the placement left without a stage
        layout = self.check(cmd)
        positions = torch.tensor(cmd.positions, dtype=torch.int64)  # (B, T), or (N, 1) packed
        rows = cmd.rows
        for step, other in self.pending.items():
            if rows & other and (step != cmd.tokens_of or self.recurrent):
                raise WorkerMessageRejected(f"step {cmd.step_id}: rows {sorted(rows & other)} overlap step "
                                            f"{step}'s, not yet published or rolled back")
        tokens = self._kept_tokens(cmd) if cmd.tokens_of is not None else None
        self.pending[cmd.step_id] = rows  # settled by publish / rollback, also after a failure
        sent = False
        try:
            handoff_s = 0.0
            one = SegmentStep(cmd.step_id, positions, cmd.start, cmd.all_logits, cmd.first_row,
                              cmd.eager or layout is not None, layout)
            if tokens is not None:
                x = tokens  # (B, 1), where the exit sampled them
            elif self.inbound is None:
                x = torch.tensor(cmd.tokens, dtype=torch.int64)  # (B, T)
            else:
                x = self.inbound.recv(cmd.step_id, positions, self.hidden_size, self.stages[0].dtype).hidden
                handoff_s = self.inbound.last_transfer_s
            pos = self.segment.put_positions(one, tuple(x.shape))
            # batched decode (per-row positions) replays graphs too: the batcher pads its groups to
            # graph buckets (Executor.step_graphs), so few graphs are captured
            out, timed = self.segment.run(one, x.to(self.stages[0].device), pos)
            if self.outbound is not None:
                sent = True
                self.outbound.send(Handoff(cmd.step_id, positions, out.hidden))
                return SegmentResult(None, timed.stage_s, handoff_s)
            return SegmentResult(out, timed.stage_s, handoff_s)
        except BaseException:
            if self.outbound is not None and not sent:
                try:
                    self.outbound.send_abort(cmd.step_id)
                except Exception:
                    pass  # the next worker is gone too; the coordinator sees it
            raise

    def keep_tokens(self, step_id: int, tokens: torch.Tensor) -> None:
        """Keep step ``step_id``'s greedy tokens ``(rows, 1)`` (on the exit's device) for a run that names
        them (where this segment runs the entry too); only the latest :data:`KEPT_STEPS` steps' are kept."""
        if self.inbound is not None:
            return
        self.kept[step_id] = tokens
        while len(self.kept) > KEPT_STEPS:
            del self.kept[next(iter(self.kept))]

    def _kept_tokens(self, cmd: Run) -> torch.Tensor:
        """The tokens ``cmd`` reads (``tokens_of``), taken from :attr:`kept`; :class:`StepFailed` when this
        segment does not hold them (the step failed or was rolled back, or this worker runs no entry and exit)."""
        tokens = self.kept.pop(cmd.tokens_of, None) if self.inbound is None and self.outbound is None else None  # type: ignore[arg-type]
        if tokens is None:
            raise StepFailed(f"step {cmd.step_id} reads the tokens of step {cmd.tokens_of}, which this worker does "
                             f"not hold (that step failed or was rolled back)")
        if tokens.shape[0] != len(cmd.positions):
            raise WorkerMessageRejected(f"step {cmd.step_id}: {len(cmd.positions)} rows read step {cmd.tokens_of}'s "
                                        f"{tokens.shape[0]} tokens")
        return tokens

    def check(self, cmd: Run) -> StepLayout | None:
        """:class:`WorkerMessageRejected` unless ``cmd`` fits this segment: token ids inside the
        vocabulary, positions inside the context, rows among the sequence slots (a packed step's
        layout a step's, naming them). Returns the packed step's layout (None: a rectangle)."""
        layout = cmd.layout  # its own checks and its fit to the tokens ran when the run was decoded
        if self.vocab_size and any(t >= self.vocab_size for row in cmd.tokens or () for t in row):
            raise WorkerMessageRejected(f"step {cmd.step_id}: a token id is outside the vocabulary ({self.vocab_size})")
        if self.context and any(p >= self.context for row in cmd.positions for p in row):
            raise WorkerMessageRejected(f"step {cmd.step_id}: a position is outside the context ({self.context})")
        if layout is not None:
            if self.batch and max(layout.rows) >= self.batch:
                raise WorkerMessageRejected(f"step {cmd.step_id}: row {max(layout.rows)} for {self.batch} slots")
            if [p for row in cmd.positions for p in row] != layout.positions():
                raise WorkerMessageRejected(f"step {cmd.step_id}: positions are not the layout's")
        elif self.batch and cmd.first_row + len(cmd.positions) > self.batch:
            raise WorkerMessageRejected(f"step {cmd.step_id}: rows {cmd.first_row}..{cmd.first_row + len(cmd.positions) - 1} "
                                        f"for {self.batch} slots")
        return layout

    def rearrange(self, cmd: RowOp) -> None:
        """Apply row operation ``cmd`` (:class:`Reset`, :class:`SetBlocks`, :class:`Move`, :class:`Restore`) to every stage,
        after checking it against the rows and the KV pool (:class:`WorkerMessageRejected`: no stage changed)."""
        if not self.stages:
            return
        self.check_rows(cmd)
        for stage in self.stages:
            if isinstance(cmd, Reset):
                stage.reset(cmd.slot)
            elif isinstance(cmd, SetBlocks):
                stage.set_blocks(cmd.slot, cmd.blocks)
            elif isinstance(cmd, Move):
                stage.move(cmd.src, cmd.dst)
            elif isinstance(cmd, Restore):
                stage.restore(cmd.slot, cmd.entry)

    def check_rows(self, cmd: RowOp) -> None:
        """:func:`check_row_op` against this segment's rows and KV pool."""
        table = self.stages[0].block_table
        assert table is not None, "allocate_state first"
        slots = next((s.states.slots for s in self.stages if s.states is not None and s.states.slots is not None), None)
        check_row_op(cmd, self.batch, table, range(slots.first_snapshot, slots.entries) if slots else range(0))

    def publish(self, step_id: int = 0) -> None:
        """Accept step ``step_id``'s state (0: every step not settled)."""
        for rows in self._settle(step_id):
            for stage in self.stages:
                stage.publish(rows)

    def rollback(self, step_id: int = 0) -> None:
        """Discard step ``step_id``'s state and kept tokens (0: every step not settled)."""
        self.kept.pop(step_id, None)
        for rows in self._settle(step_id):
            for stage in self.stages:
                stage.rollback(rows)

    def _settle(self, step_id: int) -> list[frozenset[int] | None]:
        if step_id == 0:
            self.pending.clear()
            self.kept.clear()
            return [None]
        rows = self.pending.pop(step_id, None)
        return [rows] if rows is not None else []  # a step never run here (rejected before it): nothing

    def reset(self, slot: int) -> None:
        for stage in self.stages:
            stage.reset(slot)

    def measured_bytes(self) -> list[int]:
        return [stage.measured_bytes() for stage in self.stages]

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
        self.stages = []


def check_row_op(cmd: RowOp, batch: int, table: BlockTable, snapshots: range) -> None:
    """:class:`WorkerMessageRejected` unless row operation ``cmd`` names rows of the ``batch`` held,
    block ids of ``table``'s pool (no more than a row holds) and, restoring, one of the ``snapshots``
    entries. The coordinator checks each before it rides on a run; every worker checks it again."""
    rows = cmd.named_rows
    if any(r >= batch for r in rows):
        raise WorkerMessageRejected(f"{type(cmd).__struct_config__.tag}: rows {rows} for {batch} slots")
    if isinstance(cmd, Restore) and cmd.entry not in snapshots:
        raise WorkerMessageRejected(f"restore: entry {cmd.entry} is not a snapshot entry ({snapshots.start}.."
                                    f"{snapshots.stop - 1})")
    if isinstance(cmd, SetBlocks) and (len(cmd.blocks) > table.blocks_per_row
                                       or any(b >= table.num_blocks for b in cmd.blocks)):
        raise WorkerMessageRejected(f"set_blocks: {len(cmd.blocks)} block ids up to {max(cmd.blocks, default=0)} "
                                    f"for a pool of {table.num_blocks} blocks, {table.blocks_per_row} per row")
