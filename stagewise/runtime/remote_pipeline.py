"""DistributedPipeline: an :class:`~stagewise.runtime.executor.Executor` whose stages run in worker
processes (on any host). It is no :class:`Pipeline`: the coordinator holds only meta-device views of
the stages (:class:`RemoteStage`) and never touches a device a worker owns (no peer access, no
allocation, no CUDA context there).

The coordinator (this object, rank 0) hosts the rendezvous store and the control plane (its pool's
:class:`CoordinatorPlane`): every command goes to every member worker on the plane, numbered in one
order, and is acknowledged there. Each step is a two-phase transaction:

1. :class:`Run`: every worker runs its stages, the activation moving worker to worker over the data
   process group (:class:`DistributedChannel`), and acknowledges; the exit's worker's acknowledgement
   carries the logits and features. State stays provisional everywhere.
2. all acknowledged success -> ``publish``; anything else (a failure, a lost worker, no answer
   within ``timeout_s``) -> ``rollback`` to every live worker, and a typed error.

Micro-batches: :meth:`DistributedPipeline.submit` sends a step's ``run`` and returns; its handle
collects, publishes or rolls back when its result is read. Every worker executes the commands in
order, so with one micro-batch per worker in flight (:attr:`max_in_flight`) worker k runs step i
while worker k+1 runs step i-1. Each worker keeps the provisional state of every unsettled step
apart (by step id and rows), so publishing or rolling back one never touches another; a step (or
row operation) over rows of an unsettled step settles that one first. A failed step is rolled back
alone; a lost worker rolls back every step in flight and fails each with :class:`WorkerLost`.

Row operations (:data:`RowOp`: continuous batching over the workers' state rows) are checked here
against the workers' rows, context and KV pool (a bad one changes nothing and fails with
:class:`WorkerMessageRejected` at once), then ride on the next :class:`Run` (``Run.ops``), which every
worker checks again and applies them before: no round trip of their own. A worker lost before that run fails the run with :class:`WorkerLost`.

A lost worker (process exit, silent heartbeat, no answer in time) fails the request with
:class:`WorkerLost` (HTTP 503) and leaves the pipeline *degraded*: requests are refused until a
worker of the same rank rejoins (local workers are respawned automatically), reloads its stage and
every worker rebuilds the data group; then it serves again. ``health()`` reports all of it.

The parts: :class:`WorkerLayout` (who runs what), :class:`WorkerCommands` (the numbered commands and
their acknowledgements), :class:`RemoteStep` (a step's handle and what its acknowledgements give back),
:class:`WorkerFaults` (losses, failures and their typed errors) and :class:`WorkerRecovery` (regroups
and the watcher); this class steps and settles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from stagewise.errors import (
    StagewiseError,
    StepCancelled,
    StepFailed,
    WorkerLost,
    WorkerMessageRejected,
    WorkerNotJoined,
)
from stagewise.models.stage_model import StageOutput
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.distributed_group import choose_backend
from stagewise.runtime.greedy_pairs import greedy_pairs
from stagewise.runtime.pipeline import CancelCheck, FaultHook, StepHandle, StepTimings
from stagewise.runtime.remote_stage import RemoteStage
from stagewise.runtime.remote_step import RemoteStep, step_output, step_timings
from stagewise.runtime.stage import Stage, StageSpec
from stagewise.runtime.worker_commands import WorkerCommands
from stagewise.runtime.worker_faults import WorkerFaults, describe
from stagewise.runtime.worker_layout import WorkerLayout
from stagewise.runtime.worker_messages import JoinReport, Move, Reset, Restore, Rollback, RowOp, Run, SetBlocks
from stagewise.runtime.worker_pool import WorkerPool
from stagewise.runtime.worker_recovery import WorkerRecovery
from stagewise.runtime.worker_segment import check_row_op
from stagewise.runtime.worker_tokens import WorkerTokens
from stagewise.spec.kv_pool import KVPool, default_pool_blocks
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.state_bytes import recurrent_entries


class DistributedPipeline:
    """Stages ``specs`` run by workers ``owners[k]`` (ranks >= 1) of ``pool``; see the module doc.

    Every stage holds ``batch`` state rows of ``context`` positions over a KV pool of ``kv_blocks``
    blocks (default: every row its whole context) and ``snapshots`` prefix-snapshot entries, as
    in-process stages would.
    ``timeout_s`` bounds one step (and every data-group operation); ``load_timeout_s`` bounds
    joining and loading. ``respawn``: restart lost local workers. ``rejoin=False``: a lost worker
    fails the pipeline for good (callers should exit with the message) instead of waiting.
    """

    device_tokens = False  # token ids travel to the workers from the host
    supports_rows = True  # workers hold ``batch`` state rows over one KV pool; row operations are commands

    def __init__(self, pool: WorkerPool, config: ModelConfig, model: str, specs: list[StageSpec], owners: list[int],
                 dtype: torch.dtype, batch: int, context: int, timeout_s: float = 30.0,
                 load_timeout_s: float = 600.0, respawn: bool = True, rejoin: bool = True,
                 cuda_graphs: bool = True, kv_blocks: int | None = None, snapshots: int = 0,
                 packed_tokens: int = 0) -> None:
        remote = [RemoteStage(s, config, dtype, r) for s, r in zip(specs, owners, strict=True)]
        self.layout = WorkerLayout(model, tuple(specs), tuple(owners), dtype, batch, context,
                                   choose_backend([s.torch_device for s in specs]), timeout_s, cuda_graphs,
                                   kv_blocks or default_pool_blocks(batch, context),  # every stage's pool, in every worker
                                   snapshots, packed_tokens)
        for stage in remote:
            stage.describe_state(batch, context, self.layout.kv_blocks, snapshots)  # shapes, bytes, the block table (kv_pool)
        self.stages: list[Stage] = list(remote)
        self.step_id = 0
        self.fault_hook: FaultHook | None = None
        self.timing = False  # the workers always time their stages and boundaries
        self.last_timings = StepTimings()
        self.pool = pool
        self.faults = WorkerFaults(pool, self.layout, rejoin, respawn)
        self.commands = WorkerCommands(pool, lambda: self.faults.lost)
        self._lock = threading.RLock()
        self.recovery = WorkerRecovery(pool, self.layout, self.commands, self.faults, remote, self._lock,
                                       load_timeout_s)
        self._pending: dict[int, RemoteStep] = {}  # seq of a run not yet settled -> its handle
        # a greedy step's tokens may stay with the worker that runs the entry and the exit, where no stage holds
        # recurrent state: the next step over its rows reads them there, sent before this one settles (worker_tokens)
        self.keeps_tokens = len(set(owners)) == 1 and not any(stage.recurrent for stage in self.stages)
        self._run_ahead = self.keeps_tokens and torch.device(specs[-1].torch_device).type == "cuda"
        self._row_ops: list[RowOp] = []  # row operations checked here, applied by the workers before the next run

    def start(self, joins: dict[int, JoinReport] | None = None, join_timeout_s: float = 60.0) -> None:
        """Wait for every worker to join (unless ``joins`` already holds them), send each its
        assignment and wait until all loaded their stages and formed the data group.

        Raises :class:`WorkerNotJoined` (after stopping every worker) when that fails in time."""
        ranks = list(range(1, self.pool.count + 1))
        try:
            found = joins if joins is not None else self.pool.wait_joins(ranks, join_timeout_s)
            for report in found.values():
                self.pool.admit(report)
            self.recovery.watch()
            problems = self.recovery.regroup(found)
            if problems:
                raise WorkerNotJoined(f"workers could not start: {describe(problems)}")
        except BaseException:
            self.close()
            raise

    # ----- what the executor exposes ---------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        return self.faults.degraded

    @property
    def rows(self) -> int:
        return self.layout.batch

    @property
    def kv_pool(self) -> KVPool:
        """The KV pool every worker's stages hold (same blocks, same table)."""
        table = next(s.block_table for s in self.stages if s.block_table is not None)
        return KVPool(table.num_blocks, table.block_tokens, table.blocks_per_row)

    def greedy_token(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy pair ``(2,)`` and token ``(1, 1)`` of ``logits`` ``(V,)`` on the host (the tokens
        travel to the workers from the host: ``device_tokens`` is False)."""
        tokens, pairs = greedy_pairs(logits[None].cpu())  # (1, 1), (1, 2)
        return pairs[0], tokens

    @property
    def snapshot_entries(self) -> range:
        """The prefix-snapshot entries the workers' stages keep (where a stage keeps recurrent state)."""
        linear = any(getattr(block, "is_linear", False) for stage in self.stages for block in stage.model.model.layers.values())
        first = recurrent_entries(self.layout.batch)  # past the zero entry and every row's two (models/state_slots.py)
        return range(first, first + self.layout.snapshots) if linear else range(0)

    @property
    def step_graphs(self) -> bool:
        """Whether the workers replay CUDA graphs (``cuda_graphs`` and a stage on a CUDA device)."""
        return self.layout.cuda_graphs and any(torch.device(s.torch_device).type == "cuda" for s in self.layout.specs)

    @property
    def run_ahead(self) -> bool:
        """Whether a greedy step's handle names its tokens, kept by the worker (:attr:`keeps_tokens`), for the
        next step over its rows: by default where the exit is a CUDA device, as in process
        (:attr:`Pipeline.run_ahead`); settable where the worker keeps tokens (tests on the CPU)."""
        return self._run_ahead

    @run_ahead.setter
    def run_ahead(self, value: bool) -> None:
        if value and not self.keeps_tokens:
            raise ValueError("only one worker that runs every stage, none with recurrent state, keeps tokens")
        self._run_ahead = value

    @property
    def max_in_flight(self) -> int:
        """One step per worker that runs stages: while worker k runs micro-batch i, worker k+1 runs i-1
        (each worker executes its commands in order; steps over disjoint rows are settled apart)."""
        return self.layout.stepping_workers

    # ----- steps ---------------------------------------------------------------------------------

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: CancelCheck | None = None, first_row: int = 0,
             eager: bool = False, layout: StepLayout | None = None) -> StageOutput:
        """As :meth:`Executor.step` (workers decide their graphs themselves; a packed step's ``layout``
        travels with it); also raises :class:`WorkerLost` when a worker is lost. Waits for the step:
        :meth:`submit` does not."""
        return self._submit(tokens, positions, start, all_logits, first_row, cancel, eager, False, layout).result()

    def submit(self, tokens: torch.Tensor | WorkerTokens, positions: torch.Tensor, start: int | None = None,
               all_logits: bool = False, first_row: int = 0, eager: bool = False,
               greedy: bool = False, layout: StepLayout | None = None) -> StepHandle:
        """Send the step's ``run`` to every worker and return at once; the handle's ``result()`` waits
        for the acknowledgements, then publishes the step (or rolls it back and raises its typed
        error). A step over rows of an unsettled one settles that one first (module doc), but where it
        reads that step's tokens (``tokens``: a greedy handle's :class:`WorkerTokens`). ``greedy``: the
        exit worker sends each row's greedy pair, not the logits; with :attr:`run_ahead` the
        handle's ``tokens`` name the step's tokens, kept by the worker. ``layout``: a packed step."""
        return self._submit(tokens, positions, start, all_logits, first_row, None, eager, greedy, layout)

    def _submit(self, tokens: torch.Tensor | WorkerTokens, positions: torch.Tensor, start: int | None,
                all_logits: bool, first_row: int, cancel: CancelCheck | None, eager: bool, greedy: bool,
                layout: StepLayout | None = None) -> RemoteStep:
        self.faults.refuse()
        reads = tokens.step_id if isinstance(tokens, WorkerTokens) else None
        if isinstance(tokens, WorkerTokens) and not (self.keeps_tokens and layout is None and tokens.first_row == first_row
                                                     and tokens.rows == positions.shape[0]):
            raise ValueError(f"a step reads step {reads}'s tokens only from a worker that keeps them, a token a row "
                             f"of the same rows")
        with self._lock:
            rows = frozenset(layout.rows if layout is not None else range(first_row, first_row + int(positions.shape[0])))
            for earlier in [h for h in self._pending.values() if h.rows & rows and h.step_id != reads]:
                self._settle(earlier)
                if earlier.error is not None:  # its sequences failed: nothing may build on its rows
                    raise StepFailed(f"step {earlier.step_id} over rows {sorted(earlier.rows & rows)} failed "
                                     f"before this one could start ({earlier.error})")
            self.faults.refuse()
            if self.faults.needs_regroup:
                self._settle_all()
                if problems := self.recovery.regroup({}):
                    self.faults.lose(self.commands, problems)
                    raise WorkerLost(f"the data group could not be rebuilt: {self.faults.message}")
            self.step_id += 1
            step_id = self.step_id
            try:
                if self.fault_hook is not None:
                    for k in range(len(self.stages)):
                        self.fault_hook(k, step_id)
                if cancel is not None and cancel():
                    raise StepCancelled(f"step {step_id} cancelled before it started")
            except StagewiseError:
                raise
            except Exception as exc:
                raise StepFailed(f"step {step_id} failed and was rolled back: {type(exc).__name__}: {exc}") from exc
            pairs_only = greedy and not all_logits  # the exit sends each row's greedy pair, not the logits
            ops, self._row_ops = self._row_ops, []
            given = {"tokens_of": tokens.step_id} if isinstance(tokens, WorkerTokens) else {"tokens": tokens.cpu().tolist()}
            seq = self.commands.send(Run, step_id=step_id, **given, positions=positions.cpu().tolist(), start=start,
                                     all_logits=all_logits, first_row=first_row, eager=eager, greedy=pairs_only,
                                     ops=ops, layout=layout)
            handle = RemoteStep(self._settle, seq, step_id, rows, cancel, pairs_only, reads)
            if pairs_only and self._run_ahead and layout is None:
                handle.tokens = WorkerTokens(step_id, first_row, len(rows))
            self._pending[seq] = handle
            return handle

    def _settle(self, handle: RemoteStep) -> None:
        """Wait for ``handle``'s acknowledgements; publish it, or roll it back and keep its typed error
        (a lost worker fails every unsettled step: all are rolled back)."""
        with self._lock:
            if handle.settled:
                return
            try:
                handle.output = self._finish(handle)
            except StagewiseError as exc:
                handle.error = exc
                for reader in self._pending.values():  # a step that read its tokens is rolled back with it
                    if reader.reads == handle.step_id:
                        reader.read_failed = True
            finally:
                handle.settled = True
                self._pending.pop(handle.seq, None)
            if self._pending and self.degraded:  # the others cannot complete either: rolled back with it
                why = self.faults.failed or self.faults.message
                self._fail_pending(lambda step: WorkerLost(f"step {step.step_id} rolled back: {why}"))

    def _settle_all(self) -> None:
        for handle in sorted(self._pending.values(), key=lambda h: h.seq):
            self._settle(handle)

    def _fail_pending(self, error: Callable[[RemoteStep], StagewiseError]) -> None:
        """Settle every unsettled step with ``error(step)``, sending nothing (the caller rolls back)."""
        for handle in self._pending.values():
            handle.error = error(handle)
            handle.settled = True
        self._pending.clear()

    def _finish(self, handle: RemoteStep) -> StageOutput:
        """Collect step ``handle``; publish it and return its output, or roll it back and raise."""
        step_id, faults = handle.step_id, self.faults
        if self.degraded:
            self.pool.plane.forget(handle.seq)
            self.commands.send(Rollback)
            raise WorkerLost(f"step {step_id} rolled back: {faults.failed or faults.message or 'closed'}")
        outcome, acks = self.commands.collect(handle.seq, self.layout.timeout_s)
        ok = outcome == "all" and len(acks) == len(self.pool.members) and all(a.ok for a in acks.values())
        if ok and handle.cancel is not None and handle.cancel():
            self.commands.send(Rollback, step_id=step_id)
            raise StepCancelled(f"step {step_id} cancelled before it was published")
        if ok and handle.read_failed:
            self.commands.send(Rollback, step_id=step_id)
            raise StepFailed(f"step {step_id} rolled back: step {handle.reads}, whose tokens it read, was rolled back")
        if not ok:
            lost = outcome in ("lost", "timeout") or bool(self.pool.dead())
            self.commands.send(Rollback, step_id=0 if lost else step_id)  # a lost worker: every step in flight
            faults.raise_for(self.commands, f"step {step_id}", outcome, acks, rolled_back=True)
        try:
            out = step_output(handle.seq, handle.greedy, acks[self.layout.owners[-1]])
        except WorkerMessageRejected as exc:
            self.commands.send(Rollback, step_id=step_id)
            raise StepFailed(f"step {step_id} rolled back: {exc}") from None
        self.commands.to_publish.append(step_id)  # told to the workers with the next command
        self.last_timings = step_timings(self.layout.owners, acks)
        return out

    def rollback(self) -> None:
        """Roll back every step not yet settled (their handles raise :class:`StepFailed`)."""
        with self._lock:
            self._fail_pending(lambda step: StepFailed(f"step {step.step_id} rolled back"))
            if not self.faults.closed:
                self.commands.send(Rollback)

    # ----- row operations (continuous batching) --------------------------------------------------

    def reset(self, slot: int) -> None:
        """Start a new sequence in ``slot`` on every worker (refused while degraded)."""
        self._rearrange(Reset(slot=slot))

    def restore(self, row: int, entry: int) -> None:
        """As :meth:`Executor.restore`, on every worker's stages."""
        self._rearrange(Restore(slot=row, entry=entry))

    def set_blocks(self, row: int, block_ids: Sequence[int]) -> None:
        """As :meth:`Executor.set_blocks`, on every worker's stages."""
        self._rearrange(SetBlocks(slot=row, blocks=[int(b) for b in block_ids]))

    def move(self, src: int, dst: int) -> None:
        """As :meth:`Executor.move`, on every worker's stages."""
        self._rearrange(Move(src=src, dst=dst))

    def _rearrange(self, cmd: RowOp) -> None:
        """Check row operation ``cmd`` against the workers' rows, context and KV pool
        (:class:`WorkerMessageRejected`: nothing changed) and queue it: it rides on the next run, which
        every worker applies it before (no round trip of its own). Raises :class:`WorkerLost` while
        the pipeline is degraded; a worker lost before the next run fails that run."""
        self.faults.refuse()
        with self._lock:
            table = self.stages[0].block_table
            assert table is not None  # described at construction
            check_row_op(cmd, self.layout.batch, table, self.snapshot_entries)
            named = frozenset(cmd.named_rows)
            for handle in [h for h in self._pending.values() if h.rows & named]:
                self._settle(handle)  # its outcome stays with its handle
            self.faults.refuse()
            self._row_ops.append(cmd)

    # ----- health and the end --------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """As :meth:`WorkerFaults.health`, for the data group's current generation."""
        return self.faults.health(self.recovery.gen)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the pipeline is not degraded (True) or ``timeout_s`` passed (False)."""
        faults = self.faults
        self.pool.plane.wait(lambda: not faults.degraded or bool(faults.failed) or faults.closed, timeout_s)
        return not self.degraded

    def close(self) -> None:
        """Tell every worker to exit, then reap (and if need be kill) the local ones."""
        if self.faults.closed:
            return
        with self._lock:
            self.faults.closed = True
            self.pool.plane.wake()  # wait_ready
            self._fail_pending(lambda step: WorkerLost("the distributed pipeline is closed"))
            self.commands.exit_all()
            self.pool.close()
