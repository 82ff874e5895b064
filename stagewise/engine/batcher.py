"""Batcher: continuous batching — many sequences on one pipeline, every decode step runs them all.

Each sequence owns a state row (slot) on every stage while it runs (until it ends or is
preempted). Rows ``0 .. D-1`` are the decoding sequences, kept contiguous; new sequences are
prefilled together in the staging rows above them (:class:`StagingArea`: one step of ``k`` rows of
``T`` tokens each, ``k * T`` at most the prefill chunk), one step per iteration between decode
steps, then join the decoding rows. An iteration:

1. start queued sequences in the staging rows while rows, their prompts' KV blocks and the step's
   token budget allow (in order: the queue's head first);
2. when sequences are ready to join or finished rows leave holes: wait for everything in flight,
   move rows (compaction, finished staging rows to rows ``D ..``) and split the decoding rows into groups;
3. launch one prefill step of the staging rows (if any);
4. for each group (micro-batch): collect its previous step's tokens, then launch its next step.

With N stages there are N groups, and up to N steps are in flight: while stage k runs group i,
stage k+1 runs group i-1 (vLLM's pipeline-parallel batch queue). On one stage there is one group
and a step's tokens are collected before the next is launched. With stages in N worker processes
there are N groups too (``Pipeline.max_in_flight``): a step is sent (:meth:`Pipeline.submit`) and
published when its tokens are collected, so its failure reaches its sequences then; a prefill
chunk is collected before the next chunk of the same rows is sent. A group's size is rounded up to a
graph bucket (:func:`~stagewise.engine.decode_groups.batch_bucket`) with free rows as padding, so few CUDA graphs cover all batch
sizes. Greedy rows are sampled on the exit device (two numbers per row come back); rows that
sample otherwise (temperature, penalties, top log-probabilities) through their own
:class:`Sampler` on the host, so a seeded request draws the same tokens in any batch.

KV blocks (paged cache): a sequence holds the blocks of its positions, from the pipeline's one
:class:`BlockAllocator`, and the pipeline's block tables name them (the bookkeeping:
:class:`~stagewise.engine.sequence_blocks.SequenceBlocks`; the policy below is the batcher's). A sequence starts when its
prompt's blocks are free; a decoding sequence takes its next block when it crosses a block boundary.
When none is free, the newest admitted sequence (possibly the one asking) is preempted: everything
in flight is collected, its blocks and row are freed and it goes back to the front of the queue. When
it restarts it prefills its prompt and the tokens it already generated (all but the last, which is
its next input) and goes on decoding: nothing is sampled or reported twice, and its sampler's state
carries on. A pipeline without a KV pool keeps every row's whole context.

Packed steps (a pipeline whose ``packed_steps``: in process, attention only): prefill is not a
rectangle but runs of each staging row's next tokens, given the step's token budget first come,
first served (:meth:`StagingArea.chunks`), flattened into one token column beside the decoding rows
of the first group (:class:`~stagewise.models.step_layout.StepLayout`; vLLM's chunked prefill mixed
with decode): the budget (``prefill_chunk``) counts those rows' tokens too, so a step that carries
prompts costs one step, not a decode step and a prefill step, and the rows that decode meanwhile
wait for no more than one budget's tokens. With nothing decoding, the prompts' chunks make the step
alone. Steps without prompts are the plain decode steps above (CUDA graphs).

Every step is the pipeline's transactional step; a failed step fails the sequences it carried
(rolled back) and no other. The batcher runs on one thread (the engine's worker).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from stagewise.engine.decode_groups import plan_groups
from stagewise.engine.generator import GenerationRequest, TokenEvent
from stagewise.engine.sampling import Sample
from stagewise.engine.sequence import Sequence
from stagewise.engine.sequence_blocks import SequenceBlocks
from stagewise.engine.staging_area import StagingArea
from stagewise.engine.step_plan import plan_packed_step
from stagewise.errors import ContextLengthExceeded, RequestError, StagewiseError, StepCancelled
from stagewise.runtime.greedy_pairs import greedy_pairs
from stagewise.runtime.pipeline import Pipeline, StepHandle
from stagewise.spec.kv_pool import KVPool


@dataclass(eq=False)
class _InFlight:
    """A launched step whose tokens have not been collected: a decode group or a prefill chunk."""

    rows: tuple[Sequence | None, ...]  # per row of the step (None: padding)
    logits: torch.Tensor | None  # (P, 1, V) on the exit device
    pairs: torch.Tensor | None  # (P, 2) greedy token and log-probability, host (pinned) once ready
    ready: object = None  # CUDA event the host copy of ``pairs`` completes at
    tokens: torch.Tensor | None = None  # (P, 1) the greedy tokens on the exit device (every row greedy)
    group: int = -1  # decode group index; -1 for a prefill chunk
    final: bool = True  # prefill: the prompt's last chunk (its logits give the first token)
    sample_rows: tuple[bool, ...] | None = None  # prefill: the rows whose first token this step samples
    handle: StepHandle | None = None  # a step whose output (and failure) comes when it is collected


class Batcher:
    """Continuous batching over ``pipeline`` (see the module doc).

    Args:
        pipeline: an in-process pipeline with ``rows`` sequence slots on every stage.
        max_context: positions per sequence slot.
        prefill_chunk: tokens per step that prefills prompts (a packed step's decoding rows counted).
        micro_batches: decode groups in flight (default: ``pipeline.max_in_flight``: one per stage in
            process, one per worker with stages in worker processes).
        packed: prefill in packed steps beside the decoding rows (default: where the pipeline
            takes them, ``pipeline.packed_steps``, and settles steps when launched); False: rectangles
            of staging rows between decode steps.
    """

    def __init__(self, pipeline: Pipeline, max_context: int, prefill_chunk: int = 512,
                 micro_batches: int | None = None, packed: bool | None = None) -> None:
        self.pipeline = pipeline
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.vocab_size = pipeline.stages[0].model.config.vocab_size
        self.slots = pipeline.rows
        self.micro_batches = max(1, micro_batches or pipeline.max_in_flight)
        self.graphs = pipeline.step_graphs
        can_pack = pipeline.packed_steps and not pipeline.deferred_results  # a packed step is read when launched
        self.packed = can_pack if packed is None else packed
        if self.packed and not can_pack:
            raise ValueError("this pipeline takes no packed steps (or settles its steps only when read)")
        self.queue: deque[Sequence] = deque()
        self.decoding: list[Sequence | None] = []  # rows 0 .. D-1 (None: finished, a hole until compaction)
        self.area: StagingArea[Sequence] = StagingArea(prefill_chunk, packed=self.packed)  # prefilling in, or ready to join from, the staging rows
        self._area_aligned = True  # the staging rows share one recurrent buffer (else align before a step)
        self.groups: list[tuple[int, int, int]] = []  # (first row, sequences, rows run incl. padding)
        self.in_flight: deque[_InFlight] = deque()
        self._regroup_needed = False
        self._events: list[tuple[Sequence, TokenEvent]] = []  # sampled, reported after the next launches
        self.kv = SequenceBlocks(pipeline, self.slots)  # the KV blocks of each sequence's positions
        self.preemptions = 0  # sequences preempted (blocks ran out) since construction
        self.prefill_tokens = 0  # prompt tokens launched in prefill steps since construction
        self.launched_shapes: set[tuple[int, int]] = set()  # decode steps' (first row, rows run) so far
        self._admissions = 0
        self.kv.clear()

    @property
    def pool(self) -> KVPool | None:
        """The pipeline's KV pool (None: every row keeps its whole context)."""
        return self.kv.pool

    @property
    def sequence_tokens(self) -> int:
        """Positions one sequence may use: the context, and never more than the whole KV pool."""
        return self.kv.sequence_tokens(self.max_context)

    # ----- admission ---------------------------------------------------------------------------
    @property
    def staging(self) -> list[Sequence]:
        """The sequences in the staging rows, bottom first."""
        return self.area.members

    @property
    def active(self) -> int:
        """Sequences admitted and not finished."""
        return len(self.queue) + len(self.staging) + sum(s is not None for s in self.decoding)

    @property
    def free(self) -> int:
        """Sequences that can be added without waiting for a slot."""
        return max(0, self.slots - self.active)

    @property
    def used_blocks(self) -> int:
        """KV blocks held by live sequences (0 without a pool)."""
        return self.kv.used_blocks

    def rows_in_use(self) -> int:
        """State rows holding a live sequence."""
        return len(self.staging) + sum(s is not None for s in self.decoding)

    def check(self, request: GenerationRequest) -> None:
        n = len(request.prompt_ids)
        if n >= self.max_context:
            raise ContextLengthExceeded(f"the prompt has {n} tokens; this model's context is {self.max_context} tokens")
        self.kv.check_prompt(n)
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")

    def add(self, sequence: Sequence) -> None:
        """Queue ``sequence`` (raises when it is invalid); it starts when a slot is free, in order."""
        self.check(sequence.request)
        sequence.budget = min(sequence.request.max_tokens, self.sequence_tokens - sequence.prompt_len)
        self.queue.append(sequence)

    # ----- one iteration -----------------------------------------------------------------------
    def iterate(self) -> None:
        """Advance every sequence by (at most) one step; see the module doc. A failed row operation
        (reset, blocks, move, align: a lost worker) fails every sequence with its typed error."""
        try:
            self._advance()
        except StagewiseError as exc:
            self.fail_all(exc)

    def _advance(self) -> None:
        for seq in [s for s in self.queue if s.cancelled()]:
            self.queue.remove(seq)
            self._cancel(seq)
        if self._regroup_needed or self.area.finished():
            self._drain()
            self._regroup()
        while self.queue and self._can_start(self.queue[0]):
            self._start_staging(self.queue.popleft())
        if self.staging and not self._regroup_needed and not (self.packed and self.groups):
            self._launch_prefill()  # packed beside decoding rows: with group 0's step below
            self._retire_to(self.micro_batches)
        for g in range(len(self.groups)):
            previous = next((item for item in self.in_flight if item.group == g), None)
            if g == 0 and self.packed and self.staging and not self._regroup_needed:
                self._retire_group(g)
                self._launch_packed(g)
            elif previous is not None and previous.tokens is not None:
                # every row greedy: the next step reads the tokens where they were sampled and is
                # launched before the host collects them, so the devices never wait for the host
                self._launch_decode(g, previous.tokens)
                while previous in self.in_flight:
                    self._retire(self.in_flight.popleft())
            else:
                self._retire_group(g)
                self._launch_decode(g)
            self._retire_to(self.micro_batches)
        self._report()

    def drain(self) -> None:
        """Collect every step in flight (the batcher is idle or about to stop)."""
        self._drain()
        self._report()

    def fail_all(self, error: StagewiseError) -> None:
        """End every sequence with ``error`` (after a bug in the batcher itself) and forget the steps in flight
        (steps not yet published are rolled back)."""
        if any(item.handle is not None for item in self.in_flight):
            try:
                self.pipeline.rollback()
            except Exception:
                pass  # the pipeline is failing too; its next step says how
        self.in_flight.clear()
        self._events.clear()
        live = [*self.queue, *self.staging, *(s for s in self.decoding if s)]
        self.queue.clear()
        self._fail(tuple(live), error)
        self.decoding, self.groups = [], []
        self.area = StagingArea(self.prefill_chunk, packed=self.packed)
        self._regroup_needed = False
        self.kv.clear()

    # ----- sequences in and out ----------------------------------------------------------------
    @staticmethod
    def _prefill_ids(seq: Sequence) -> tuple[int, ...]:
        """The prompt, and after a preemption the tokens generated before it but the last (the next input)."""
        return tuple(seq.request.prompt_ids) + tuple(seq.tokens[:-1])

    def _staging_floor(self) -> int:
        """The lowest row the staging rows may start at: above the decoding rows and their groups'
        padding (a padding row's state is overwritten by every step of its group)."""
        padded = max((first + run for first, _, run in self.groups), default=0)
        return max(len(self.decoding), padded)

    def _first_staging_row(self, seq: Sequence) -> int:
        """Where an empty staging area starts for ``seq``: just above the decoding rows when another
        queued sequence could be prefilled with it (packing), else the top row (its chunks replay the
        top row's graphs) — or row 0 when nothing decodes."""
        floor = self._staging_floor()
        if floor == 0:
            return 0
        if self.packed:
            return floor  # a packed step runs eagerly: no graph's rows to aim for
        probe = StagingArea(self.prefill_chunk, floor, [seq])
        others = [s for s in self.queue if s is not seq][:1]
        if others and floor + 1 < self.slots and probe.accepts(len(self._prefill_ids(others[0]))):
            return floor
        return self.slots - 1

    def _can_start(self, seq: Sequence) -> bool:
        """Whether ``seq`` may start now: a free row on top of the staging rows, its prefill's blocks
        free, and the staging rows' order and step budget kept (see :class:`StagingArea`)."""
        if self._regroup_needed:
            return False  # rows are about to move
        first = self.area.first if self.staging else self._staging_floor()
        if first + len(self.staging) >= self.slots:
            return False
        ids = self._prefill_ids(seq)
        return self.area.accepts(len(ids)) and self.kv.fits(len(ids))

    def _start_staging(self, seq: Sequence) -> None:
        seq.ids = self._prefill_ids(seq)
        seq.prefilled = 0
        if not self.staging:
            self.area.first = self._first_staging_row(seq)
        row = self.area.add(seq)
        self._area_aligned = len(self.staging) == 1
        seq.row = row
        seq.length = 0
        seq.admitted = self._admissions
        self._admissions += 1
        self.kv.assign_prompt(seq)
        try:
            self.pipeline.reset(row)
            self.kv.name_blocks(seq)
        except StagewiseError as exc:  # stages in worker processes: a lost worker refuses it
            self._fail((seq,), exc)

    def _free_row(self, seq: Sequence) -> None:
        """Take ``seq`` off its row: the staging row, or a hole in the decoding rows until the next
        compaction; its blocks go back to the allocator and its table row to scratch."""
        if seq in self.staging:
            if seq is not self.staging[-1]:
                self._regroup_needed = True  # the staging rows above it close the gap
            self.staging.remove(seq)
        elif 0 <= seq.row < len(self.decoding) and self.decoding[seq.row] is seq:
            self.decoding[seq.row] = None
            self._regroup_needed = True
        self.kv.release(seq)

    def _end(self, seq: Sequence) -> None:
        """``seq`` is finished: free its row and blocks (or drop it from the queue)."""
        seq.done = True
        if seq in self.queue:
            self.queue.remove(seq)
        self._free_row(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and row and put it first in the queue, to be recomputed (nothing in flight)."""
        assert not self.in_flight
        self._free_row(seq)
        seq.row = -1
        seq.length = 0
        seq.preemptions += 1
        self.preemptions += 1
        self.queue.appendleft(seq)

    def _newest(self) -> Sequence | None:
        live = [s for s in (*self.decoding, *self.staging) if s is not None and not s.done]
        return max(live, key=lambda s: s.admitted, default=None)

    def _reserve_blocks(self, g: int) -> None:
        """Give every sequence of group ``g`` the block of its next position, preempting the newest
        sequences while none is free (see the module doc)."""
        for seq in self._members(g):
            if seq is None or seq.done or seq.row < 0 or not self.kv.needs_block(seq):
                continue  # gone, preempted above, or its next position is in a block it has
            if self.kv.exhausted:
                self._drain()  # steps in flight may end sequences; nothing may move while they run
            while self.kv.exhausted and not seq.done and seq.row >= 0:
                victim = self._newest()
                assert victim is not None
                self._preempt(victim)
            if seq.done or seq.row < 0:
                continue  # it finished while draining, or was the newest itself
            self.kv.grant_next(seq)

    def _cancel(self, seq: Sequence) -> None:
        self._end(seq)
        seq.errored = True
        seq.on_error(StepCancelled("cancelled by the client"))

    def _fail(self, seqs: tuple[Sequence | None, ...], error: StagewiseError) -> None:
        for seq in seqs:
            if seq is not None and not seq.done:
                self._end(seq)
                seq.errored = True
                seq.on_error(error)

    def _emit(self, seq: Sequence, sample: Sample) -> None:
        """Take ``seq``'s next token; end it on a stop token or its budget. Its consumer hears of it in
        :meth:`_report`, once the next steps are launched (the host's work overlaps the devices')."""
        stop = sample.token in seq.request.stop_token_ids
        last = stop or seq.generated + 1 >= seq.budget
        reason = ("stop" if stop else "length") if last else None
        self._events.append((seq, TokenEvent(seq.generated, sample, reason)))
        seq.generated += 1
        seq.next_token = sample.token
        seq.tokens.append(sample.token)
        if last:
            self._end(seq)

    def _report(self) -> None:
        """Hand the sampled tokens to their consumers; a consumer may end its sequence (stop string,
        client gone): a step launched meanwhile then computed its row for nothing."""
        events, self._events = self._events, []
        for seq, event in events:
            if seq.errored:
                continue
            keep = seq.on_token(event)
            if not keep and not seq.done:
                self._end(seq)

    # ----- prefill ------------------------------------------------------------------------------
    def _launch_prefill(self) -> None:
        """One step of every staging row: ``T`` tokens each (:meth:`StagingArea.step_tokens`), or with
        packed steps several staging rows' chunks alone (:meth:`_launch_packed`; a lone prompt's
        chunk is the same step as a rectangle, whose full chunks replay a CUDA graph)."""
        if self.packed and len(self.staging) > 1:
            self._launch_packed(None)
            return
        for seq in [s for s in self.staging if s.cancelled()]:
            self._cancel(seq)
        if not self.staging or self._regroup_needed:
            return  # a member left from between the others: the rows close up first
        if self.pipeline.deferred_results:  # the previous chunk's rows: published before the next chunk runs
            for item in [item for item in self.in_flight if item.group == -1]:
                self.in_flight.remove(item)
                self._retire(item)
            if not self.staging or self._regroup_needed:
                return  # it failed, or it ended a member
        members = list(self.staging)
        steps = self.area.step_tokens()
        if len(members) > 1 and not self._area_aligned:
            self.pipeline.align(self.area.rows)  # members that started apart share one recurrent buffer
            self._area_aligned = True
        starts = [seq.prefilled for seq in members]
        tokens = torch.tensor([seq.ids[lo : lo + steps] for seq, lo in zip(members, starts, strict=True)],
                              dtype=torch.long)  # (k, T)
        positions = torch.arange(steps)[None] + torch.tensor(starts)[:, None]  # (k, T)
        common = starts[0] if len(set(starts)) == 1 else None
        # graphs (captured per first row and shape) only for one sequence's chunks in the rows a lone
        # prompt starts in: packed steps and other rows run eagerly, so their shapes capture nothing
        eager = len(members) > 1 or self.area.first not in (0, self.slots - 1)
        try:
            handle = self.pipeline.submit(tokens, positions, start=common, first_row=self.area.first, eager=eager)
        except StagewiseError as exc:
            self._fail(tuple(members), exc)
            return
        self.prefill_tokens += steps * len(members)  # k rows of T tokens
        for seq in members:
            seq.prefilled += steps
            seq.length = seq.prefilled
        # a recomputed sequence (preempted) already has its next token: nothing to sample
        sample_rows = tuple(seq.prefilled >= len(seq.ids) and not seq.tokens for seq in members)
        final = any(seq.prefilled >= len(seq.ids) for seq in members)
        if self.pipeline.deferred_results:
            self.in_flight.append(_InFlight(tuple(members), None, None, final=final, sample_rows=sample_rows,
                                            handle=handle))
            return
        logits = handle.result().logits if any(sample_rows) else None
        self.in_flight.append(_InFlight(tuple(members), logits, None, final=final, sample_rows=sample_rows))

    def _launch_packed(self, g: int | None) -> None:
        """One packed step: group ``g``'s decoding rows (none when None), then the staging rows' chunks
        within what the budget leaves (at least one token), first come, first served; logits for the
        decoding rows and the prompts this step ends (see the module doc)."""
        decoding: list[Sequence] = []
        if g is not None:
            for seq in self._members(g):
                if seq is not None and not seq.done and seq.cancelled():
                    self._cancel(seq)
            if self.pool is not None:
                self._reserve_blocks(g)
            decoding = [s for s in self._members(g) if s is not None and not s.done and s.row >= 0]
        for seq in [s for s in self.staging if s.cancelled()]:
            self._cancel(seq)
        plan = plan_packed_step(decoding, self.area, self.prefill_chunk) if not self._regroup_needed else None
        if plan is None or not plan.members:  # rows are about to move, or no prompt has tokens left
            if g is not None:
                self._launch_decode(g)  # the decoding rows' plain step
            return
        members = [self.staging[i] for i in plan.members]
        sampled = [self.staging[i] for i in plan.sampled]
        tokens = torch.tensor(plan.token_ids, dtype=torch.long)[:, None]  # (N, 1)
        positions = torch.tensor(plan.layout.positions(), dtype=torch.long)[:, None]  # (N, 1)
        try:
            handle = self.pipeline.submit(tokens, positions, eager=True, layout=plan.layout)
        except StagewiseError as exc:
            self._fail((*decoding, *members), exc)
            return
        for seq in decoding:
            seq.length += 1
        for seq, take in zip(members, plan.chunks, strict=True):
            seq.prefilled += take
            seq.length = seq.prefilled
        rows = (*decoding, *sampled)  # one per logits row
        logits = handle.result().logits if rows else None  # (S, 1, V)
        pairs, ready = None, None
        if logits is not None and any(s.device_greedy for s in rows):
            _, pairs, ready = _greedy_pairs(logits[:, -1])
        self.in_flight.append(_InFlight(rows, logits, pairs, ready, group=-1 if g is None else g))

    # ----- decode -------------------------------------------------------------------------------
    def _regroup(self) -> None:
        """Compact the decoding rows, join the staging sequence, split the rows into groups."""
        rows = list(self.decoding)
        while rows and rows[-1] is None:
            rows.pop()
        for hole in range(len(rows)):  # fill each hole with the last live row: one move per hole
            if hole >= len(rows):
                break
            if rows[hole] is None:
                seq = rows.pop()
                assert seq is not None
                self.pipeline.move(seq.row, hole, seq.length)
                seq.row = hole
                rows[hole] = seq
                while rows and rows[-1] is None:
                    rows.pop()
        live: list[Sequence] = [s for s in rows if s is not None]
        assert all(s.row == i for i, s in enumerate(live))
        for ready in self.area.finished():  # the bottom staging rows, in order: each moves down or stays
            self.staging.remove(ready)
            dst = len(live)
            if ready.row != dst:
                self.pipeline.move(ready.row, dst, ready.length)
                ready.row = dst
            live.append(ready)
        self._close_staging(len(live))
        self.decoding = list(live)
        self.groups = self._plan_groups(len(live))
        for first, _, run in self.groups:
            if run > 1:
                self.pipeline.align(slice(first, first + run))
        self._regroup_needed = False

    def _close_staging(self, floor: int) -> None:
        """Give the staging rows left contiguous rows again (bottom up, each moves down or stays),
        starting no lower than ``floor`` (the decoding rows end there)."""
        first = max(floor, min((s.row for s in self.staging), default=floor))
        for i, seq in enumerate(self.staging):
            if seq.row != first + i:
                self.pipeline.move(seq.row, first + i, seq.length)
                seq.row = first + i
                self._area_aligned = False
        self.area.first = first

    def _plan_groups(self, count: int) -> list[tuple[int, int, int]]:
        # padding never reaches a staging row, and leaves one row for the next sequence to start in
        limit = self.area.first if self.staging else (self.slots - 1 if count < self.slots else self.slots)
        return plan_groups(count, self.micro_batches, self.graphs, limit)

    def decode_shapes(self) -> dict[tuple[int, int], int]:
        """Every decode step shape ``(first row, rows run)`` this batcher launches with no sequence in
        the staging rows, each with the fewest decoding sequences that launch it (what warm-up runs)."""
        shapes: dict[tuple[int, int], int] = {}
        for count in range(1, self.slots + 1):
            limit = self.slots - 1 if count < self.slots else self.slots
            for first, _, run in plan_groups(count, self.micro_batches, self.graphs, limit):
                shapes.setdefault((first, run), count)
        return shapes

    def _members(self, g: int) -> list[Sequence | None]:
        first, members, _ = self.groups[g]
        return list(self.decoding[first : first + members])

    def _launch_decode(self, g: int, device_tokens: torch.Tensor | None = None) -> None:
        """Launch group ``g``'s next step; its input tokens are the host's (each row's last sampled
        token) or ``device_tokens``, the previous step's greedy tokens still on the device."""
        first, members, run = self.groups[g]
        for seq in self._members(g):
            if seq is not None and not seq.done and seq.cancelled():
                self._cancel(seq)
        if self.pool is not None:
            self._reserve_blocks(g)
        rows = [s if s is not None and not s.done else None for s in self._members(g)] + [None] * (run - members)
        if not any(rows):
            return
        if device_tokens is not None:
            tokens = device_tokens  # (P, 1)
        else:
            tokens = torch.tensor([[s.next_token if s else 0] for s in rows], dtype=torch.long)  # (P, 1)
        positions = torch.tensor([[s.length if s else 0] for s in rows], dtype=torch.long)  # (P, 1)
        all_greedy = all(s is None or s.device_greedy for s in rows)  # two numbers a row suffice
        self.launched_shapes.add((first, run))
        try:
            handle = self.pipeline.submit(tokens, positions, start=None, first_row=first, greedy=all_greedy)
        except StagewiseError as exc:
            self._fail(tuple(rows), exc)
            return
        for seq in rows:
            if seq is not None:
                seq.length += 1
        if self.pipeline.deferred_results:
            self.in_flight.append(_InFlight(tuple(rows), None, None, group=g, handle=handle))
            return
        logits = handle.result().logits  # (P, 1, V)
        assert logits is not None
        pairs, ready, greedy = None, None, None
        if any(s is not None and s.device_greedy for s in rows):
            greedy, pairs, ready = _greedy_pairs(logits[:, -1])
            if not all_greedy:
                greedy = None  # some row samples on the host: its token is not known on the device
        self.in_flight.append(_InFlight(tuple(rows), logits, pairs, ready, greedy, group=g))

    # ----- collecting results ----------------------------------------------------------------------
    def _retire_group(self, g: int) -> None:
        while any(item.group == g for item in self.in_flight):
            self._retire(self.in_flight.popleft())

    def _retire_to(self, depth: int) -> None:
        """Collect the oldest steps until at most ``depth`` are in flight."""
        while len(self.in_flight) > depth:
            self._retire(self.in_flight.popleft())

    def _drain(self) -> None:
        while self.in_flight:
            self._retire(self.in_flight.popleft())

    def _settle(self, item: _InFlight) -> bool:
        """Read a deferred step's output into ``item`` (publishing it); False when it failed (its
        sequences are failed with its typed error)."""
        assert item.handle is not None
        try:
            out = item.handle.result()
        except StagewiseError as exc:
            self._fail(item.rows, exc)
            return False
        item.handle = None
        if item.sample_rows is not None and not any(item.sample_rows):
            return True  # a prefill chunk with nothing to sample
        if out.pairs is not None:  # the exit computed every row's greedy pair (all rows greedy)
            item.pairs = out.pairs
            return True
        item.logits = out.logits
        assert item.logits is not None
        if item.group >= 0 and any(s is not None and s.device_greedy for s in item.rows):
            _, item.pairs, item.ready = _greedy_pairs(item.logits[:, -1])
        return True

    def _retire(self, item: _InFlight) -> None:
        if item.handle is not None and not self._settle(item):
            return
        if item.logits is None and item.pairs is None:
            return  # prefill chunks before the prompts' last: nothing to sample
        if item.ready is not None:
            item.ready.synchronize()  # type: ignore[attr-defined]
        host_pairs = item.pairs.tolist() if item.pairs is not None else None
        for i, seq in enumerate(item.rows):
            if seq is None or seq.done or (item.sample_rows is not None and not item.sample_rows[i]):
                continue
            try:
                if host_pairs is not None and seq.device_greedy:
                    sample = seq.sampler.accept(*host_pairs[i])
                else:
                    assert item.logits is not None  # a step with pairs only has every row greedy
                    sample = seq.sampler.sample(item.logits[i, -1], seq.request.top_logprobs)
            except StagewiseError as exc:
                self._fail((seq,), exc)
                continue
            self._emit(seq, sample)


_read_streams: dict[torch.device, torch.cuda.Stream] = {}


def _greedy_pairs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Greedy token and its log-probability for every row of ``logits`` ``(P, V)`` on their device; the
    ``(P, 2)`` result is copied to the host on a side stream. Returns the tokens ``(P, 1)`` on the
    device, the host tensor and the event its copy completes at (None: already on the host)."""
    device_tokens, pairs = greedy_pairs(logits)  # (P, 1), (P, 2)
    if pairs.device.type != "cuda":
        return device_tokens, pairs, None
    host = torch.empty(pairs.shape, dtype=pairs.dtype, pin_memory=True)
    side = _read_streams.get(pairs.device)
    if side is None:
        side = _read_streams[pairs.device] = torch.cuda.Stream(pairs.device)
    side.wait_stream(torch.cuda.current_stream(pairs.device))
    pairs.record_stream(side)
    with torch.cuda.device(pairs.device), torch.cuda.stream(side):
        host.copy_(pairs, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    return device_tokens, host, ready

