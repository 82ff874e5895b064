"""Batcher: continuous batching — many sequences on one pipeline, every decode step runs them all.

The policy — the queue, the state rows, which sequences start and which is preempted when KV blocks
run out, where rows move — is the :class:`~stagewise.engine.step_scheduler.StepScheduler`'s (no
tensors); the batcher is the runner: it turns the scheduler's rows into steps, submits them to the
pipeline, samples and reports. Decoding rows are ``0 .. D-1``; new sequences are prefilled in the
staging rows above them (:class:`StagingArea`). An iteration:

1. the scheduler starts queued sequences in the staging rows while rows, their prompts' KV blocks
   and the step's token budget allow (in order: the queue's head first);
2. when sequences are ready to join or finished rows leave holes: wait for everything in flight,
   and the scheduler moves rows (compaction, finished staging rows to rows ``D ..``: table rewrites,
   no state is copied) and regroups;
3. for each group (micro-batch): collect its previous step's tokens, then launch its next step —
   group 0's with the staging rows' prompt chunks packed beside its decoding rows (below), or the
   prompts' chunks alone when nothing decodes (when a sequence needs a KV block and none is free,
   the scheduler preempts after a drain).

One step path for every architecture (attention-only and hybrid): prompts are prefilled in packed
steps (:class:`~stagewise.models.step_layout.StepLayout`; vLLM's chunked prefill mixed with decode),
runs of each staging row's next tokens, the step's token budget (``prefill_chunk``) given first come,
first served (:meth:`StagingArea.chunks`, chunks cut at KV block boundaries), flattened into one
token column beside the decoding rows of the first group: the budget counts those rows' tokens too,
so a step that carries prompts costs one step, not a decode step and a prefill step, and the rows
that decode meanwhile wait for no more than one budget's tokens. Steps without prompts are the plain
decode steps (CUDA graphs).

With N stages there are N groups, and up to N steps are in flight: while stage k runs group i,
stage k+1 runs group i-1 (vLLM's pipeline-parallel batch queue). On one stage there is one group
and a step's tokens are collected before the next is launched. With stages in N worker processes
there are N groups too (``max_in_flight``). One schedule for both: a step is submitted
(:meth:`Pipeline.submit`) and its handle read when its tokens are collected (in process it was
published at launch; with workers it is published, or rolled back, then, so its failure reaches
its sequences then). Where every row of a group is greedy and the exit is a CUDA device, the handle
carries the tokens on that device and the group's next step takes them before the host reads them.
A group's size is rounded up to a graph bucket (:func:`~stagewise.engine.decode_groups.batch_bucket`)
with free rows as padding, so few CUDA graphs cover all batch sizes. Greedy rows are sampled on the
exit device (two numbers per row come back); rows that sample otherwise (temperature, penalties, top
log-probabilities) through their own :class:`Sampler` on the host, so a seeded request draws the
same tokens in any batch.

Every step is the pipeline's transactional step; a failed step fails the sequences it carried
(rolled back) and no other. The batcher runs on one thread (the engine's worker).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable

import torch

from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.in_flight import InFlight
from stagewise.engine.prefix_root import holds_recurrent_state, prefix_root
from stagewise.engine.prefix_snapshots import PrefixSnapshots
from stagewise.engine.sample import Sample
from stagewise.engine.sequence import Sequence
from stagewise.engine.sequence_blocks import SequenceBlocks
from stagewise.engine.step_scheduler import StepScheduler
from stagewise.errors import ContextLengthExceeded, RequestError, StagewiseError
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.executor import Executor
from stagewise.runtime.worker_tokens import WorkerTokens
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, KVPool


class Batcher:
    """Continuous batching over ``pipeline`` (see the module doc).

    Args:
        pipeline: an in-process pipeline with ``rows`` sequence slots on every stage.
        max_context: positions per sequence slot.
        prefill_chunk: tokens per step that prefills prompts (a packed step's decoding rows counted).
        micro_batches: decode groups in flight (default: ``pipeline.max_in_flight``: one per stage in
            process, one per worker with stages in worker processes).
        prefix_cache: share the KV blocks of cached prompt prefixes (:mod:`~stagewise.engine.prefix_cache`)
            and, where stages hold recurrent state, restore its snapshots
            (:mod:`~stagewise.engine.prefix_snapshots`); off without a KV pool.
    """

    def __init__(self, pipeline: Executor, max_context: int, prefill_chunk: int = 512,
                 micro_batches: int | None = None, prefix_cache: bool = True) -> None:
        self.pipeline = pipeline
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.vocab_size = pipeline.stages[0].model.config.vocab_size
        self.slots = pipeline.rows
        self.micro_batches = max(1, micro_batches or pipeline.max_in_flight)
        self.graphs = pipeline.step_graphs
        self.in_flight: deque[InFlight] = deque()
        self._events: list[tuple[Sequence, TokenEvent]] = []  # sampled, reported after the next launches
        self.prefill_tokens = 0  # prompt tokens launched in prefill steps since construction
        self.launched_shapes: set[tuple[int, int]] = set()  # decode steps' (first row, rows run) so far
        self.on_report: Callable[[], None] | None = None  # called before sampled tokens reach consumers
        root = prefix_root(pipeline) if prefix_cache else None
        snapshots = None
        if root is not None and holds_recurrent_state(pipeline):
            # NOTE: a snapshot is a state at a block boundary that chunks aligned to blocks reach as an
            # uncached prompt does; a budget below a block cuts chunks anywhere: no hybrid prefix cache
            root = root if prefill_chunk >= KV_BLOCK_TOKENS else None
            snapshots = PrefixSnapshots(pipeline.snapshot_entries)
        kv = SequenceBlocks(pipeline, self.slots, root, snapshots)  # each sequence's KV blocks (and snapshots)
        self.sched = StepScheduler(pipeline, kv, self.slots, max_context, prefill_chunk, self.micro_batches,
                                   self.graphs)
        kv.clear()

    @property
    def kv(self) -> SequenceBlocks:
        return self.sched.kv

    @property
    def pool(self) -> KVPool | None:
        """The pipeline's KV pool (None: every row keeps its whole context)."""
        return self.kv.pool

    @property
    def sequence_tokens(self) -> int:
        """Positions one sequence may use: the context, and never more than the whole KV pool."""
        return self.kv.sequence_tokens(self.max_context)

    @property
    def queue(self) -> deque[Sequence]:
        return self.sched.queue

    @property
    def decoding(self) -> list[Sequence | None]:
        return self.sched.decoding

    @property
    def staging(self) -> list[Sequence]:
        """The sequences in the staging rows, bottom first."""
        return self.sched.staging

    @property
    def preemptions(self) -> int:
        """Sequences preempted (blocks ran out) since construction."""
        return self.sched.preemptions

    @property
    def _regroup_needed(self) -> bool:
        return self.sched.regroup_needed

    @property
    def active(self) -> int:
        """Sequences admitted and not finished."""
        return self.sched.active

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
        return self.sched.rows_in_use()

    def decode_shapes(self) -> dict[tuple[int, int], int]:
        """Every decode step shape ``(first row, rows run)`` this batcher launches with no sequence in
        the staging rows, each with the fewest decoding sequences that launch it (what warm-up runs)."""
        return self.sched.decode_shapes()

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
        self.sched.add(sequence)

    # ----- one iteration -----------------------------------------------------------------------
    def iterate(self) -> None:
        """Advance every sequence by (at most) one step; see the module doc. A failed row operation
        (reset, blocks, move: a lost worker) fails every sequence with its typed error."""
        try:
            self._advance()
        except StagewiseError as exc:
            self.fail_all(exc)

    def _advance(self) -> None:
        sched = self.sched
        sched.cancel_queued()
        if sched.regroup_needed or sched.area.finished():
            self._drain()
            sched.regroup()
        sched.admit()
        if self.staging and not self.sched.regroup_needed and not self.sched.groups:
            self._launch_packed(None)  # nothing decodes: the prompts' chunks make the step alone
            self._retire_to(self.micro_batches)
        for g in range(len(self.sched.groups)):
            previous = next((item for item in self.in_flight if item.group == g), None)
            if g == 0 and self.staging and not self.sched.regroup_needed:
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
        self.sched.fail_all(error)

    # ----- tokens out ---------------------------------------------------------------------------
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
            self.sched.end(seq)

    def _report(self) -> None:
        """Hand the sampled tokens to their consumers; a consumer may end its sequence (stop string,
        client gone): a step launched meanwhile then computed its row for nothing."""
        if self.on_report is not None:
            self.on_report()
        events, self._events = self._events, []
        for seq, event in events:
            if seq.errored:
                continue
            keep = seq.on_token(event)
            if not keep and not seq.done:
                self.sched.end(seq)

    # ----- prompts ------------------------------------------------------------------------------
    def _launch_packed(self, g: int | None) -> None:
        """One packed step: group ``g``'s decoding rows (none when None), then the staging rows' chunks
        within what the budget leaves (at least a block), first come, first served; logits for the
        decoding rows and the prompts this step ends (see the module doc)."""
        plan = self.sched.plan_packed(g, self._drain, self.prefill_chunk)
        if plan is None or not plan.members:  # rows are about to move, or no prompt has tokens left
            if g is not None:
                self._launch_decode(g)  # the decoding rows' plain step
            return
        seqs = self.sched.step_rows(plan)
        decoding = [s for s in seqs[: plan.decoding] if s is not None]
        members = [s for s in seqs[plan.decoding :] if s is not None]
        assert [s.row for s in (*decoding, *members)] == list(plan.layout.rows)  # every row's sequence
        sampled = [self.staging[i] for i in plan.sampled]
        layout, snapshots = self._snapshots(plan.layout, members, plan.chunks)
        tokens = torch.tensor(plan.token_ids, dtype=torch.long)[:, None]  # (N, 1)
        positions = torch.tensor(plan.layout.positions(), dtype=torch.long)[:, None]  # (N, 1)
        rows = (*decoding, *sampled)  # one per logits row (S, 1, V)
        self.prefill_tokens += sum(plan.chunks)
        try:
            handle = self.pipeline.submit(tokens, positions, greedy=plan.greedy, layout=layout)
        except StagewiseError as exc:
            self._settle_snapshots(snapshots, False)
            self.sched.fail(seqs, exc)
            return
        for seq in decoding:
            seq.length += 1
        for seq, take in zip(members, plan.chunks, strict=True):
            seq.prefilled += take
            seq.length = seq.prefilled
            self.sched.restored(seq)  # its restored snapshot is read by this step: evictable again
        self.in_flight.append(InFlight(rows, handle, group=-1 if g is None else g, snapshots=snapshots))

    def _snapshots(self, layout: StepLayout, members: list[Sequence],
                   chunks: tuple[int, ...]) -> tuple[StepLayout, tuple[tuple[int, bytes], ...]]:
        """``layout`` with the prefix snapshots its prompt chunks take (at most one each, where a chunk
        crosses a snapshot point no snapshot is cached at, while entries are free), and each one's
        ``(entry, key)`` to register once the step is published."""
        store = self.kv.snapshots
        if store is None:
            return layout, ()
        taken: list[tuple[int, int, int]] = []
        pending: list[tuple[int, bytes]] = []
        for k, (seq, take) in enumerate(zip(members, chunks, strict=True)):
            point = self.kv.snapshot_point(seq, seq.prefilled, seq.prefilled + take)
            if point is None:
                continue
            key = self.kv.snapshot_key(seq, point)
            if store.has(key) or any(key == other for _, other in pending):
                continue
            entry = store.reserve()
            if entry is None:
                break  # every entry is pending or about to be read
            taken.append((layout.decoding + k, point - seq.prefilled, entry))
            pending.append((entry, key))
        return (dataclasses.replace(layout, snapshots=tuple(taken)) if taken else layout), tuple(pending)

    def _settle_snapshots(self, snapshots: tuple[tuple[int, bytes], ...], published: bool) -> None:
        """Key the snapshots a step wrote (``published``), or free their entries (it failed)."""
        store = self.kv.snapshots
        for entry, key in snapshots:
            assert store is not None
            if published:
                store.register(entry, key)
            else:
                store.release(entry)

    # ----- decode -------------------------------------------------------------------------------
    def _launch_decode(self, g: int, device_tokens: torch.Tensor | WorkerTokens | None = None) -> None:
        """Launch group ``g``'s next step; its input tokens are the host's (each row's last sampled
        token) or ``device_tokens``, the previous step's greedy tokens still on the device (a worker's)."""
        plan = self.sched.plan_decode(g, self._drain)
        if plan is None:
            return
        rows = self.sched.step_rows(plan)
        if device_tokens is not None:
            tokens = device_tokens  # (P, 1)
        else:
            tokens = torch.tensor(plan.token_ids, dtype=torch.long)[:, None]  # (P, 1)
        positions = torch.tensor(plan.positions, dtype=torch.long)[:, None]  # (P, 1)
        self.launched_shapes.add((plan.first_row, plan.rows))
        try:
            handle = self.pipeline.submit(tokens, positions, start=None, first_row=plan.first_row, greedy=plan.greedy)
        except StagewiseError as exc:
            self.sched.fail(rows, exc)
            return
        for seq in rows:
            if seq is not None:
                seq.length += 1
        # every row greedy on a device that runs ahead of the host: the next step reads these tokens there
        self.in_flight.append(InFlight(rows, handle, group=g, tokens=handle.tokens))

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

    def _retire(self, item: InFlight) -> None:
        if item.handle is not None and (error := item.settle()) is not None:
            self._settle_snapshots(item.snapshots, False)
            self.sched.fail(item.rows, error)
            return
        self._settle_snapshots(item.snapshots, True)
        item.snapshots = ()
        if item.logits is None and item.pairs is None:
            return  # only prompts' chunks before their last: nothing to sample
        if item.ready is not None:
            item.ready.synchronize()  # type: ignore[attr-defined]
        host_pairs = item.pairs.tolist() if item.pairs is not None else None
        for i, seq in enumerate(item.rows):
            if seq is None or seq.done:
                continue
            try:
                if host_pairs is not None and seq.device_greedy:
                    sample = seq.sampler.accept(*host_pairs[i])
                else:
                    assert item.logits is not None  # a step with pairs only has every row greedy
                    sample = seq.sampler.sample(item.logits[i, -1], seq.request.top_logprobs)
            except StagewiseError as exc:
                self.sched.fail((seq,), exc)
                continue
            self._emit(seq, sample)
