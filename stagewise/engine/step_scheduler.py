"""StepScheduler: the batcher's policy on host integers — which sequences hold which state rows, which
start, which is preempted, where rows move. No tensors (nano-vllm's scheduler; the batcher is the runner).

Each sequence owns a state row (slot) on every stage while it runs (until it ends or is preempted).
Rows ``0 .. D-1`` are the decoding sequences, kept contiguous and split into decode groups
(:func:`~stagewise.engine.decode_groups.plan_groups`); new sequences are prefilled together in the
staging rows above them (:class:`StagingArea`). Queued sequences start, the queue's head first, while
a row is free above the staging rows, their prefill's KV blocks are free and the staging area takes
them (its order and the step's token budget). A sequence that ends leaves a hole in the decoding rows;
before the next steps, :meth:`StepScheduler.regroup` fills each hole with the last live row
(:func:`plan_compaction`), moves the finished staging rows down to join them and plans the groups.

KV blocks (paged cache): a sequence holds the blocks of its positions (the bookkeeping:
:class:`~stagewise.engine.sequence_blocks.SequenceBlocks`); it starts when its prompt's blocks are
free, and a decoding sequence takes its next block when it crosses a block boundary. When none is
free, the newest admitted sequence (possibly the one asking) is preempted: everything in flight is
collected first, its blocks and row are freed and it goes back to the front of the queue. When it
restarts it prefills its prompt and the tokens it already generated (all but the last, which is its
next input) and goes on decoding: nothing is sampled or reported twice.

Row operations (reset, move, block-table rows) go through :class:`RowOps` (the pipeline);
a refused one (a lost worker) raises :class:`~stagewise.errors.StagewiseError` to the caller,
except a staging row's reset, which fails only its sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from stagewise.engine.decode_groups import plan_groups
from stagewise.engine.row_compaction import plan_compaction
from stagewise.engine.staging_area import StagingArea
from stagewise.engine.step_plan import DecodePlan, StepPlan, plan_decode_step, plan_packed_step
from stagewise.errors import StagewiseError, StepCancelled
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS

if TYPE_CHECKING:
    from stagewise.engine.sequence import Sequence
    from stagewise.engine.sequence_blocks import SequenceBlocks


class RowOps(Protocol):
    """The row operations the scheduler asks of the pipeline."""

    def reset(self, slot: int) -> None: ...

    def move(self, src: int, dst: int) -> None: ...

    def restore(self, row: int, entry: int) -> None: ...


class StepScheduler:
    """The queue, the state rows and their KV blocks of a batcher (module doc).

    Args:
        row_ops: the pipeline's row operations.
        kv: the KV blocks of each sequence's positions.
        slots: state rows on every stage.
        max_context: positions per sequence slot.
        prefill_chunk: tokens per step that prefills prompts.
        micro_batches: decode groups.
        graphs: decode groups run graph buckets (padding rows).
    """

    def __init__(self, row_ops: RowOps, kv: SequenceBlocks, slots: int, max_context: int, prefill_chunk: int,
                 micro_batches: int, graphs: bool) -> None:
        self.row_ops = row_ops
        self.kv = kv
        self.slots = slots
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.micro_batches = micro_batches
        self.graphs = graphs
        # chunks that do not end a prompt end on a KV block boundary (StagingArea), where the budget allows one
        self.align_tokens = KV_BLOCK_TOKENS if prefill_chunk >= KV_BLOCK_TOKENS else 1
        self.queue: deque[Sequence] = deque()
        self.decoding: list[Sequence | None] = []  # rows 0 .. D-1 (None: finished, a hole until compaction)
        self.area: StagingArea[Sequence] = self._new_area()  # prefilling in, or ready to join from, the staging rows
        self.groups: list[tuple[int, int, int]] = []  # (first row, sequences, rows run incl. padding)
        self.regroup_needed = False
        self.preemptions = 0  # sequences preempted (blocks ran out) since construction
        self._admissions = 0

    @property
    def staging(self) -> list[Sequence]:
        """The sequences in the staging rows, bottom first."""
        return self.area.members

    @property
    def active(self) -> int:
        """Sequences admitted and not finished."""
        return len(self.queue) + len(self.staging) + sum(s is not None for s in self.decoding)

    def rows_in_use(self) -> int:
        """State rows holding a live sequence."""
        return len(self.staging) + sum(s is not None for s in self.decoding)

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` (checked by the caller) with its token budget; it starts in order."""
        seq.budget = min(seq.request.max_tokens, self.kv.sequence_tokens(self.max_context) - seq.prompt_len)
        self.queue.append(seq)

    def reset(self) -> None:
        """No sequence anywhere, every block free (after :meth:`fail_all`)."""
        self.decoding, self.groups = [], []
        self.area = self._new_area()
        self.regroup_needed = False
        self.kv.clear()

    def fail_all(self, error: StagewiseError) -> None:
        """End every sequence with ``error`` and start afresh."""
        live = [*self.queue, *self.staging, *(s for s in self.decoding if s)]
        self.queue.clear()
        self.fail(tuple(live), error)
        self.reset()

    # ----- admission ---------------------------------------------------------------------------
    @staticmethod
    def prefill_ids(seq: Sequence) -> tuple[int, ...]:
        """The prompt, and after a preemption the tokens generated before it but the last (the next input)."""
        return tuple(seq.request.prompt_ids) + tuple(seq.tokens[:-1])

    def _staging_floor(self) -> int:
        """The lowest row the staging rows may start at: above the decoding rows and their groups'
        padding (a padding row's state is overwritten by every step of its group)."""
        padded = max((first + run for first, _, run in self.groups), default=0)
        return max(len(self.decoding), padded)

    def _new_area(self) -> StagingArea[Sequence]:
        return StagingArea(self.prefill_chunk, align_tokens=self.align_tokens)

    def can_start(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start now: a free row on top of the staging rows, its prefill's blocks
        free, and the staging rows' order and step budget kept (see :class:`StagingArea`)."""
        if self.regroup_needed:
            return False  # rows are about to move
        first = self.area.first if self.staging else self._staging_floor()
        if first + len(self.staging) >= self.slots:
            return False
        ids = self.prefill_ids(seq)
        left = len(ids) - self.kv.hit_tokens_for(seq, ids)  # a cached prefix is not prefilled
        return self.area.accepts(left) and self.kv.fits_start(seq, ids)

    def admit(self) -> None:
        """Start queued sequences in the staging rows, the queue's head first, while they may. A sequence
        whose prompt shares more full blocks with one still prefilling than the prefix cache holds waits
        for it, keeping its place (:meth:`SequenceBlocks.leader`: those blocks are cached, and computed
        once, when that one joins the decoding rows); the sequences behind it go on starting in order."""
        waiting: list[Sequence] = []
        while self.queue:
            seq = self.queue[0]
            if self.kv.leader(seq, self.prefill_ids(seq), self.staging) is not None:
                waiting.append(self.queue.popleft())
                continue
            if not self.can_start(seq):
                break
            self._start_staging(self.queue.popleft())
        self.queue.extendleft(reversed(waiting))

    def _start_staging(self, seq: Sequence) -> None:
        seq.ids = self.prefill_ids(seq)
        cached = self.kv.hit_tokens_for(seq, seq.ids)  # the prefix cache's hit (0 without one)
        seq.prefilled = cached
        if not self.staging:
            self.area.first = self._staging_floor()  # just above the decoding rows and their padding
        row = self.area.add(seq)
        seq.row = row
        seq.length = cached
        seq.admitted = self._admissions
        self._admissions += 1
        assigned = self.kv.assign_prompt(seq)
        assert assigned == cached
        if not seq.tokens:
            seq.cached_tokens = cached  # what its prompt's usage reports (a restart after its first token does not change it)
        try:
            snapshots = self.kv.snapshots
            if cached and snapshots is not None:  # the prefix's recurrent state: its snapshot, read in place
                entry = snapshots.lookup(self.kv.snapshot_key(seq, cached))
                assert entry is not None, "a hit on recurrent state ends where a snapshot is"
                snapshots.pin(entry)
                seq.restored = entry
                self.row_ops.restore(row, entry)
            else:
                self.row_ops.reset(row)
            self.kv.name_blocks(seq)
        except StagewiseError as exc:  # stages in worker processes: a lost worker refuses it
            self.fail((seq,), exc)

    def restored(self, seq: Sequence) -> None:
        """``seq``'s first step, which reads its restored snapshot, has run (or it ended): the snapshot
        may be evicted again."""
        if seq.restored >= 0:
            assert self.kv.snapshots is not None
            self.kv.snapshots.unpin(seq.restored)
            seq.restored = -1

    # ----- sequences out -----------------------------------------------------------------------
    def _free_row(self, seq: Sequence) -> None:
        """Take ``seq`` off its row: the staging row, or a hole in the decoding rows until the next
        compaction; its blocks go back to the allocator and its table row to scratch."""
        self.restored(seq)
        if seq in self.staging:
            if seq is not self.staging[-1]:
                self.regroup_needed = True  # the staging rows above it close the gap
            self.staging.remove(seq)
        elif 0 <= seq.row < len(self.decoding) and self.decoding[seq.row] is seq:
            self.decoding[seq.row] = None
            self.regroup_needed = True
        self.kv.release(seq)

    def end(self, seq: Sequence) -> None:
        """``seq`` is finished: free its row and blocks (or drop it from the queue)."""
        seq.done = True
        if seq in self.queue:
            self.queue.remove(seq)
        self._free_row(seq)

    def cancel(self, seq: Sequence) -> None:
        self.end(seq)
        seq.errored = True
        seq.on_error(StepCancelled("cancelled by the client"))

    def fail(self, seqs: tuple[Sequence | None, ...], error: StagewiseError) -> None:
        """End every live one of ``seqs`` with ``error``."""
        for seq in seqs:
            if seq is not None and not seq.done:
                self.end(seq)
                seq.errored = True
                seq.on_error(error)

    def cancel_queued(self) -> None:
        """End the queued sequences whose clients went away."""
        for seq in [s for s in self.queue if s.cancelled()]:
            self.queue.remove(seq)
            self.cancel(seq)

    def cancel_staging(self) -> None:
        """End the staging sequences whose clients went away."""
        for seq in [s for s in self.staging if s.cancelled()]:
            self.cancel(seq)

    def cancel_group(self, g: int) -> None:
        """End group ``g``'s sequences whose clients went away."""
        for seq in self.members(g):
            if seq is not None and not seq.done and seq.cancelled():
                self.cancel(seq)

    # ----- KV blocks ---------------------------------------------------------------------------
    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and row and put it first in the queue, to be recomputed (nothing in flight)."""
        self._free_row(seq)
        seq.row = -1
        seq.length = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.queue.appendleft(seq)

    def newest(self) -> Sequence | None:
        """The live sequence admitted last (the one preempted first)."""
        live = [s for s in (*self.decoding, *self.staging) if s is not None and not s.done]
        return max(live, key=lambda s: s.admitted, default=None)

    def reserve_blocks(self, g: int, drain: Callable[[], None]) -> None:
        """Give every sequence of group ``g`` the block of its next position, preempting the newest
        sequences while none is free; ``drain`` collects every step in flight first (module doc)."""
        for seq in self.members(g):
            if seq is None or seq.done or seq.row < 0 or not self.kv.needs_block(seq):
                continue  # gone, preempted above, or its next position is in a block it has
            if self.kv.exhausted:
                drain()  # steps in flight may end sequences; nothing may move while they run
            while self.kv.exhausted and not seq.done and seq.row >= 0:
                victim = self.newest()
                assert victim is not None
                self._preempt(victim)
            if seq.done or seq.row < 0:
                continue  # it finished while draining, or was the newest itself
            self.kv.grant_next(seq)

    # ----- rows and groups ---------------------------------------------------------------------
    def regroup(self) -> None:
        """Compact the decoding rows, join the finished staging sequences, split the rows into groups
        (nothing in flight)."""
        plan = plan_compaction([s.length if s is not None else None for s in self.decoding])
        before = list(self.decoding)
        for move in plan.moves:
            seq = before[move.src]
            assert seq is not None
            self.row_ops.move(move.src, move.dst)
            seq.row = move.dst
        live: list[Sequence] = [s for s in (before[i] for i in plan.rows) if s is not None]
        assert all(s.row == i for i, s in enumerate(live))
        for ready in self.area.finished():  # the bottom staging rows, in order: each moves down or stays
            self.staging.remove(ready)
            self.kv.register_prompt(ready)  # its prefill is published (nothing in flight): cache its blocks
            dst = len(live)
            if ready.row != dst:
                self.row_ops.move(ready.row, dst)
                ready.row = dst
            live.append(ready)
        self._close_staging(len(live))
        self.decoding = list(live)
        self.groups = self._plan_groups(len(live))
        self.regroup_needed = False

    def _close_staging(self, floor: int) -> None:
        """Give the staging rows left contiguous rows again (bottom up, each moves down or stays),
        starting no lower than ``floor`` (the decoding rows end there)."""
        first = max(floor, min((s.row for s in self.staging), default=floor))
        for i, seq in enumerate(self.staging):
            if seq.row != first + i:
                self.row_ops.move(seq.row, first + i)
                seq.row = first + i
        self.area.first = first

    def _plan_groups(self, count: int) -> list[tuple[int, int, int]]:
        # padding never reaches a staging row, and leaves one row for the next sequence to start in
        limit = self.area.first if self.staging else (self.slots - 1 if count < self.slots else self.slots)
        return plan_groups(count, self.micro_batches, self.graphs, limit)

    def decode_shapes(self) -> dict[tuple[int, int], int]:
        """Every decode step shape ``(first row, rows run)`` launched with no sequence in the staging
        rows, each with the fewest decoding sequences that launch it (what warm-up runs)."""
        shapes: dict[tuple[int, int], int] = {}
        for count in range(1, self.slots + 1):
            limit = self.slots - 1 if count < self.slots else self.slots
            for first, _, run in plan_groups(count, self.micro_batches, self.graphs, limit):
                shapes.setdefault((first, run), count)
        return shapes

    # ----- the next step ------------------------------------------------------------------------
    def plan_decode(self, g: int, drain: Callable[[], None]) -> DecodePlan | None:
        """Group ``g``'s next plain decode step: its sequences whose clients went away are ended, every
        live row gets the KV block of its next position (preempting, after ``drain``, while none is
        free), padding rows fill the group's run; None when no row is left."""
        first, members, run = self.groups[g]
        self._prepare_group(g, drain)
        rows = [s if s is not None and not s.done else None for s in self.members(g)] + [None] * (run - members)
        return plan_decode_step(g, first, rows)

    def plan_packed(self, g: int | None, drain: Callable[[], None], budget_tokens: int) -> StepPlan | None:
        """The next packed step: group ``g``'s decoding rows (none when None; prepared as for
        :meth:`plan_decode`) and the staging rows' chunks within ``budget_tokens``
        (:func:`plan_packed_step`); None while rows are about to move or nothing would run."""
        decoding: list[Sequence] = []
        if g is not None:
            self._prepare_group(g, drain)
            decoding = [s for s in self.members(g) if s is not None and not s.done and s.row >= 0]
        self.cancel_staging()
        if self.regroup_needed:
            return None
        return plan_packed_step(decoding, self.area, budget_tokens)

    def _prepare_group(self, g: int, drain: Callable[[], None]) -> None:
        """Before group ``g``'s step: end its sequences whose clients went away, give every live row the
        KV block of its next position."""
        self.cancel_group(g)
        if self.kv.pool is not None:
            self.reserve_blocks(g, drain)

    def step_rows(self, plan: DecodePlan | StepPlan) -> tuple[Sequence | None, ...]:
        """The sequences of ``plan``'s rows: a decode step's rows (None: padding), or a packed step's
        decoding rows then its staging members."""
        if isinstance(plan, DecodePlan):
            return tuple(self.decoding[plan.first_row + i] if live else None for i, live in enumerate(plan.live))
        decoding = tuple(self.decoding[row] for row in plan.layout.rows[: plan.decoding])
        return (*decoding, *(self.area.members[i] for i in plan.members))

    def members(self, g: int) -> list[Sequence | None]:
        """Group ``g``'s decoding rows' sequences (None: a hole)."""
        first, members, _ = self.groups[g]
        return list(self.decoding[first : first + members])
