"""Batcher: continuous batching — many sequences on one pipeline, every decode step runs them all.

The policy — the queue, the state rows, which sequences start and which is preempted when KV blocks
run out, where rows move — is the :class:`~stagewise.engine.step_scheduler.StepScheduler`'s (no
tensors); the batcher is the runner: it turns the scheduler's rows into steps, submits them to the
pipeline, samples and reports. Decoding rows are ``0 .. D-1``; new sequences are prefilled in the
staging rows above them (:class:`StagingArea`). An iteration:

1. the scheduler starts queued sequences in the staging rows while rows, their prompts' KV blocks
   and the step's token budget allow (in order: the queue's head first);
2. when sequences are ready to join or finished rows leave holes: wait for everything in flight,
   and the scheduler moves rows (compaction, finished staging rows to rows ``D ..``) and regroups;
3. launch one prefill step of the staging rows (if any);
4. for each group (micro-batch): collect its previous step's tokens, then launch its next step
   (when a sequence needs a KV block and none is free, the scheduler preempts after a drain).

With N stages there are N groups, and up to N steps are in flight: while stage k runs group i,
stage k+1 runs group i-1 (vLLM's pipeline-parallel batch queue). On one stage there is one group
and a step's tokens are collected before the next is launched. With stages in N worker processes
there are N groups too (``max_in_flight``). One schedule for both: a step is submitted
(:meth:`Pipeline.submit`) and its handle read when its tokens are collected (in process it was
published at launch; with workers it is published, or rolled back, then, so its failure reaches
its sequences then); a prefill chunk is collected before the next chunk of the same rows is sent.
Where every row of a group is greedy and the exit is a CUDA device, the handle carries the tokens
on that device and the group's next step takes them before the host reads them. A group's size is rounded up to a
graph bucket (:func:`~stagewise.engine.decode_groups.batch_bucket`) with free rows as padding, so few CUDA graphs cover all batch
sizes. Greedy rows are sampled on the exit device (two numbers per row come back); rows that
sample otherwise (temperature, penalties, top log-probabilities) through their own
:class:`Sampler` on the host, so a seeded request draws the same tokens in any batch.

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

import torch

from stagewise.engine.generator import GenerationRequest, TokenEvent
from stagewise.engine.in_flight import InFlight
from stagewise.engine.prefix_root import prefix_root
from stagewise.engine.sampling import Sample
from stagewise.engine.sequence import Sequence
from stagewise.engine.sequence_blocks import SequenceBlocks
from stagewise.engine.step_plan import plan_packed_step
from stagewise.engine.step_scheduler import StepScheduler
from stagewise.errors import ContextLengthExceeded, RequestError, StagewiseError
from stagewise.runtime.executor import Executor
from stagewise.spec.kv_pool import KVPool


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
        prefix_cache: share the KV blocks of cached prompt prefixes (:mod:`~stagewise.engine.prefix_cache`);
            off where a stage holds recurrent state (linear attention: not yet snapshotted) or has no KV pool.
    """

    def __init__(self, pipeline: Executor, max_context: int, prefill_chunk: int = 512,
                 micro_batches: int | None = None, packed: bool | None = None, prefix_cache: bool = True) -> None:
        self.pipeline = pipeline
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.vocab_size = pipeline.stages[0].model.config.vocab_size
        self.slots = pipeline.rows
        self.micro_batches = max(1, micro_batches or pipeline.max_in_flight)
        self.graphs = pipeline.step_graphs
        can_pack = pipeline.packed_steps
        self.packed = can_pack if packed is None else packed
        if self.packed and not can_pack:
            raise ValueError("this pipeline takes no packed steps")
        self.in_flight: deque[InFlight] = deque()
        self._events: list[tuple[Sequence, TokenEvent]] = []  # sampled, reported after the next launches
        self.prefill_tokens = 0  # prompt tokens launched in prefill steps since construction
        self.launched_shapes: set[tuple[int, int]] = set()  # decode steps' (first row, rows run) so far
        kv = SequenceBlocks(pipeline, self.slots, prefix_root(pipeline) if prefix_cache else None)  # each sequence's KV blocks
        self.sched = StepScheduler(pipeline, kv, self.slots, max_context, prefill_chunk, self.micro_batches,
                                   self.graphs, self.packed)
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
        if self.staging and not self.sched.regroup_needed and not (self.packed and self.sched.groups):
            self._launch_prefill()  # packed beside decoding rows: with group 0's step below
            self._retire_to(self.micro_batches)
        for g in range(len(self.sched.groups)):
            previous = next((item for item in self.in_flight if item.group == g), None)
            if g == 0 and self.packed and self.staging and not self.sched.regroup_needed:
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
        events, self._events = self._events, []
        for seq, event in events:
            if seq.errored:
                continue
            keep = seq.on_token(event)
            if not keep and not seq.done:
                self.sched.end(seq)

    # ----- prefill ------------------------------------------------------------------------------
    def _launch_prefill(self) -> None:
        """One step of every staging row: ``T`` tokens each (:meth:`StagingArea.step_tokens`), or with
        packed steps several staging rows' chunks alone (:meth:`_launch_packed`; a lone prompt's
        chunk is the same step as a rectangle, whose full chunks replay a CUDA graph)."""
        if self.packed and len(self.staging) > 1:
            self._launch_packed(None)
            return
        self.sched.cancel_staging()
        if not self.staging or self.sched.regroup_needed:
            return  # a member left from between the others: the rows close up first
        for item in [item for item in self.in_flight if item.group == -1]:  # the previous chunk: read first
            self.in_flight.remove(item)
            self._retire(item)
        if not self.staging or self.sched.regroup_needed:
            return  # it failed, or it ended a member
        members = list(self.staging)
        steps = self.sched.area.step_tokens()
        starts = [seq.prefilled for seq in members]
        tokens = torch.tensor([seq.ids[lo : lo + steps] for seq, lo in zip(members, starts, strict=True)],
                              dtype=torch.long)  # (k, T)
        positions = torch.arange(steps)[None] + torch.tensor(starts)[:, None]  # (k, T)
        common = starts[0] if len(set(starts)) == 1 else None
        # graphs (captured per first row and shape) only for one sequence's chunks in the rows a lone
        # prompt starts in: packed steps and other rows run eagerly, so their shapes capture nothing
        eager = len(members) > 1 or self.sched.area.first not in (0, self.slots - 1)
        try:
            handle = self.pipeline.submit(tokens, positions, start=common, first_row=self.sched.area.first, eager=eager)
        except StagewiseError as exc:
            self.sched.fail(tuple(members), exc)
            return
        self.prefill_tokens += steps * len(members)  # k rows of T tokens
        for seq in members:
            seq.prefilled += steps
            seq.length = seq.prefilled
        # a recomputed sequence (preempted) already has its next token: nothing to sample
        sample_rows = tuple(seq.prefilled >= len(seq.ids) and not seq.tokens for seq in members)
        final = any(seq.prefilled >= len(seq.ids) for seq in members)
        self.in_flight.append(InFlight(tuple(members), handle, final=final, sample_rows=sample_rows))

    def _launch_packed(self, g: int | None) -> None:
        """One packed step: group ``g``'s decoding rows (none when None), then the staging rows' chunks
        within what the budget leaves (at least one token), first come, first served; logits for the
        decoding rows and the prompts this step ends (see the module doc)."""
        decoding: list[Sequence] = []
        if g is not None:
            self.sched.cancel_group(g)
            if self.pool is not None:
                self.sched.reserve_blocks(g, self._drain)
            decoding = [s for s in self.sched.members(g) if s is not None and not s.done and s.row >= 0]
        self.sched.cancel_staging()
        plan = plan_packed_step(decoding, self.sched.area, self.prefill_chunk) if not self.sched.regroup_needed else None
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
            self.sched.fail((*decoding, *members), exc)
            return
        for seq in decoding:
            seq.length += 1
        for seq, take in zip(members, plan.chunks, strict=True):
            seq.prefilled += take
            seq.length = seq.prefilled
        rows = (*decoding, *sampled)  # one per logits row (S, 1, V)
        self.in_flight.append(InFlight(rows, handle, group=-1 if g is None else g))

    # ----- decode -------------------------------------------------------------------------------
    def _launch_decode(self, g: int, device_tokens: torch.Tensor | None = None) -> None:
        """Launch group ``g``'s next step; its input tokens are the host's (each row's last sampled
        token) or ``device_tokens``, the previous step's greedy tokens still on the device."""
        first, members, run = self.sched.groups[g]
        self.sched.cancel_group(g)
        if self.pool is not None:
            self.sched.reserve_blocks(g, self._drain)
        rows = [s if s is not None and not s.done else None for s in self.sched.members(g)] + [None] * (run - members)
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
            self.sched.fail(tuple(rows), exc)
            return
        for seq in rows:
            if seq is not None:
                seq.length += 1
        # every row greedy on a device that runs ahead of the host: the next step reads these tokens there
        self.in_flight.append(InFlight(tuple(rows), handle, group=g, tokens=handle.tokens))

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
            self.sched.fail(item.rows, error)
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
                self.sched.fail((seq,), exc)
                continue
            self._emit(seq, sample)
