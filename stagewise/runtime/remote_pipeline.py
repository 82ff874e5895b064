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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from stagewise import errors
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
from stagewise.runtime.stage import Stage, StageSpec
from stagewise.runtime.tensor_blob import dtype_name
from stagewise.runtime.worker_messages import (
    ACKNOWLEDGED,
    Ack,
    Assignment,
    Command,
    Exit,
    JoinReport,
    Move,
    Regroup,
    Reset,
    Restore,
    Rollback,
    RowOp,
    Run,
    SetBlocks,
)
from stagewise.runtime.worker_pool import WorkerPool
from stagewise.runtime.worker_segment import check_row_op
from stagewise.spec.kv_pool import KVPool, default_pool_blocks
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.state_bytes import recurrent_entries

FAIL_GRACE_S = 2.0  # after one worker fails, how long the others get to report
WATCH_S = 0.2  # how often the watcher looks for dead workers (process exits, silent heartbeats)


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
                 cuda_graphs: bool = True, kv_blocks: int | None = None, snapshots: int = 0) -> None:
        remote = [RemoteStage(s, config, dtype, r) for s, r in zip(specs, owners, strict=True)]
        self.kv_blocks = kv_blocks or default_pool_blocks(batch, context)  # every stage's pool, in every worker
        self.snapshots = snapshots
        for stage in remote:
            stage.describe_state(batch, context, self.kv_blocks, snapshots)  # shapes, bytes, the block table (kv_pool)
        self.stages: list[Stage] = list(remote)
        self.backend = choose_backend([s.torch_device for s in specs])
        self.step_id = 0
        self.fault_hook: FaultHook | None = None
        self.timing = False  # the workers always time their stages and boundaries
        self.last_timings = StepTimings()
        self.pool = pool
        self.model = model
        self.specs = specs
        self.owners = owners
        self.dtype = dtype
        self.batch = batch
        self.context = context
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.respawn = respawn
        self.rejoin = rejoin
        self.cuda_graphs = cuda_graphs
        self.max_respawns = 5
        self.respawns = 0
        self.gen = -1
        self._seq = 0
        self._lock = threading.RLock()
        self._pending: dict[int, _RemoteStep] = {}  # seq of a run not yet settled -> its handle
        self._to_publish: list[int] = []  # steps published here, told to the workers with the next command
        self._row_ops: list[RowOp] = []  # row operations checked here, applied by the workers before the next run
        self._inflight: int | None = None
        self._inflight_lost = False  # the watcher found a worker dead while a command was awaited
        self._lost: dict[int, str] = {}
        self._failed = ""
        self._needs_regroup = False
        self._closed = False
        self._message = ""
        self._watcher: threading.Thread | None = None
        self._recovering = False

    # ----- start ---------------------------------------------------------------------------------

    def start(self, joins: dict[int, JoinReport] | None = None, join_timeout_s: float = 60.0) -> None:
        """Wait for every worker to join (unless ``joins`` already holds them), send each its
        assignment and wait until all loaded their stages and formed the data group.

        Raises :class:`WorkerNotJoined` (after stopping every worker) when that fails in time."""
        ranks = list(range(1, self.pool.count + 1))
        try:
            found = joins if joins is not None else self.pool.wait_joins(ranks, join_timeout_s)
            for report in found.values():
                self.pool.admit(report)
            self._watcher = threading.Thread(target=self._watch, name="stagewise-coordinator", daemon=True)
            self._watcher.start()
            problems = self._regroup(found)
            if problems:
                raise WorkerNotJoined(f"workers could not start: {_describe(problems)}")
        except BaseException:
            self.close()
            raise

    def _stages_of(self, rank: int) -> list[int]:
        """Indices of the stages worker ``rank`` runs."""
        return [s.index for s in self.specs if self.owners[s.index] == rank]

    def _assignment(self, rank: int, incarnation: str, first_seq: int) -> Assignment:
        mine = tuple(s for s, r in zip(self.specs, self.owners, strict=True) if r == rank)
        prev = next_ = -1
        if mine:
            first, last = mine[0].index, mine[-1].index
            prev = self.owners[first - 1] - 1 if first > 0 else -1
            next_ = self.owners[last + 1] - 1 if last + 1 < len(self.specs) else -1
        return Assignment(incarnation=incarnation, model=self.model, dtype=dtype_name(self.dtype),  # type: ignore[arg-type]
                          batch=self.batch, context=self.context, stages=mine, gen=self.gen, data_rank=rank - 1,
                          data_world=self.pool.count, backend=self.backend, prev_rank=prev, next_rank=next_,  # type: ignore[arg-type]
                          first_seq=first_seq, timeout_s=self.timeout_s, cuda_graphs=self.cuda_graphs,
                          kv_blocks=self.kv_blocks, snapshots=self.snapshots)

    def _regroup(self, fresh: dict[int, JoinReport]) -> dict[int, str]:
        """New generation: survivors rebuild the data group, ``fresh`` workers load and join it.

        Returns the workers that failed to (rank -> why); empty when the group is whole again."""
        self.gen += 1
        seq = self._next_seq()
        members = self.pool.incarnations()
        survivors = {r: inc for r, inc in members.items() if r not in fresh}
        self.pool.plane.expect(seq, members)
        if survivors:
            self.pool.plane.send(survivors.items(), Regroup(seq=seq, members=members, gen=self.gen))
        for rank, report in fresh.items():
            self.pool.plane.send([(rank, report.incarnation)], self._assignment(rank, report.incarnation, seq + 1))
        _, acks = self._collect(seq, self.load_timeout_s)
        problems = {r: f"{a.error_type}: {a.error}" for r, a in acks.items() if not a.ok}
        dead = self.pool.dead()
        for rank in self.pool.members:
            if rank not in acks:
                problems[rank] = dead.get(rank, f"not ready within {self.load_timeout_s:g} s")
        if problems:
            return problems
        for stage in self.stages:
            assert isinstance(stage, RemoteStage)
            mine = self._stages_of(stage.rank)
            sizes = acks[stage.rank].measured_bytes
            if stage.rank in fresh and len(sizes) == len(mine):
                stage.reported_bytes = sizes[mine.index(stage.spec.index)]
        self._needs_regroup = False
        self._lost.clear()
        self._message = ""
        self.pool.plane.wake()  # wait_ready
        return {}

    # ----- the command bus -----------------------------------------------------------------------

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _members(self) -> dict[int, str]:
        return {r: inc for r, inc in self.pool.incarnations().items() if r not in self._lost}

    def _command(self, kind: type[Command], **fields: Any) -> int:
        """Send a ``kind`` command to every member (a :class:`Run` or :class:`Regroup` awaited: its
        acknowledgements are counted from now); the steps published since the last command ride along
        (workers publish them first: no command of their own, and every later command sees them)."""
        seq = self._next_seq()
        publish, self._to_publish = self._to_publish, []
        members = self._members()
        if kind in ACKNOWLEDGED:
            self.pool.plane.expect(seq, members)
        self.pool.plane.send(members.items(), kind(seq=seq, members=members, publish=publish, **fields))
        return seq

    def _collect(self, seq: int, timeout_s: float) -> tuple[str, dict[int, Ack]]:
        """Wait for command ``seq``'s acknowledgements; return the outcome (``all``, ``fail``, ``lost``,
        ``timeout``) and those that arrived."""
        plane = self.pool.plane
        ranks = list(self.pool.members)

        def outcome() -> str | None:
            acks = plane.acks(seq)
            if any(not a.ok for a in acks.values()):
                return "fail"
            if all(r in acks for r in ranks):
                return "all"
            return "lost" if self._inflight_lost else None

        self._inflight, self._inflight_lost = seq, False
        try:
            plane.wait(lambda: outcome() is not None, timeout_s)
            result = outcome() or "timeout"
            if result == "fail" and not self.pool.dead():  # the others abort quickly unless stuck on a lost peer
                plane.wait(lambda: all(r in plane.acks(seq) for r in ranks) or self._inflight_lost, FAIL_GRACE_S)
        finally:
            self._inflight = None
        return result, plane.forget(seq)

    # ----- steps ---------------------------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        return bool(self._lost or self._failed or self._closed)

    @property
    def rows(self) -> int:
        return self.batch

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
        first = recurrent_entries(self.batch)  # past the zero entry and every row's two (models/state_slots.py)
        return range(first, first + self.snapshots) if linear else range(0)

    @property
    def step_graphs(self) -> bool:
        """Whether the workers replay CUDA graphs (``cuda_graphs`` and a stage on a CUDA device)."""
        return self.cuda_graphs and any(torch.device(s.torch_device).type == "cuda" for s in self.specs)

    @property
    def max_in_flight(self) -> int:
        """One step per worker that runs stages: while worker k runs micro-batch i, worker k+1 runs i-1
        (each worker executes its commands in order; steps over disjoint rows are settled apart)."""
        return len({self.owners[s.index] for s in self.specs})

    def _refuse(self) -> None:
        if self._closed:
            raise WorkerLost("the distributed pipeline is closed")
        if self._failed:
            raise WorkerLost(self._failed)
        if self._lost:
            raise WorkerLost(self._message or f"workers {sorted(self._lost)} are lost; waiting for them to rejoin")

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: CancelCheck | None = None, first_row: int = 0,
             eager: bool = False, layout: StepLayout | None = None) -> StageOutput:
        """As :meth:`Executor.step` (workers decide their graphs themselves; a packed step's ``layout``
        travels with it); also raises :class:`WorkerLost` when a worker is lost. Waits for the step:
        :meth:`submit` does not."""
        return self._submit(tokens, positions, start, all_logits, first_row, cancel, eager, False, layout).result()

    def submit(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
               all_logits: bool = False, first_row: int = 0, eager: bool = False,
               greedy: bool = False, layout: StepLayout | None = None) -> StepHandle:
        """Send the step's ``run`` to every worker and return at once; the handle's ``result()`` waits
        for the acknowledgements, then publishes the step (or rolls it back and raises its typed
        error). A step over rows of an unsettled one settles that one first (module doc). ``greedy``:
        the exit worker sends each row's greedy pair, not the logits. ``layout``: a packed step."""
        return self._submit(tokens, positions, start, all_logits, first_row, None, eager, greedy, layout)

    def _submit(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None, all_logits: bool,
                first_row: int, cancel: CancelCheck | None, eager: bool, greedy: bool,
                layout: StepLayout | None = None) -> _RemoteStep:
        self._refuse()
        with self._lock:
            rows = frozenset(layout.rows if layout is not None else range(first_row, first_row + int(positions.shape[0])))
            for earlier in [h for h in self._pending.values() if h.rows & rows]:
                self._settle(earlier)
                if earlier.error is not None:  # its sequences failed: nothing may build on its rows
                    raise StepFailed(f"step {earlier.step_id} over rows {sorted(earlier.rows & rows)} failed "
                                     f"before this one could start ({earlier.error})")
            self._refuse()
            if self._needs_regroup:
                self._settle_all()
                if problems := self._regroup({}):
                    self._lose(problems)
                    raise WorkerLost(f"the data group could not be rebuilt: {self._message}")
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
            seq = self._command(Run, step_id=step_id, tokens=tokens.cpu().tolist(), positions=positions.cpu().tolist(),
                                start=start, all_logits=all_logits, first_row=first_row, eager=eager,
                                greedy=pairs_only, ops=ops, layout=layout)
            handle = _RemoteStep(self, seq, step_id, rows, cancel, pairs_only)
            self._pending[seq] = handle
            return handle

    def _settle(self, handle: _RemoteStep) -> None:
        """Wait for ``handle``'s acknowledgements; publish it, or roll it back and keep its typed error
        (a lost worker fails every unsettled step: all are rolled back)."""
        with self._lock:
            if handle.settled:
                return
            try:
                handle.output = self._finish(handle)
            except StagewiseError as exc:
                handle.error = exc
            finally:
                handle.settled = True
                self._pending.pop(handle.seq, None)
            if self._pending and self.degraded:  # the others cannot complete either: rolled back with it
                for other in list(self._pending.values()):
                    other.error = WorkerLost(f"step {other.step_id} rolled back: {self._failed or self._message}")
                    other.settled = True
                self._pending.clear()

    def _settle_all(self) -> None:
        for handle in sorted(self._pending.values(), key=lambda h: h.seq):
            self._settle(handle)

    def _finish(self, handle: _RemoteStep) -> StageOutput:
        """Collect step ``handle``; publish it and return its output, or roll it back and raise."""
        step_id = handle.step_id
        if self.degraded:
            self.pool.plane.forget(handle.seq)
            self._command(Rollback)
            raise WorkerLost(f"step {step_id} rolled back: {self._failed or self._message or 'closed'}")
        outcome, acks = self._collect(handle.seq, self.timeout_s)
        ok = outcome == "all" and len(acks) == len(self.pool.members) and all(a.ok for a in acks.values())
        if ok and handle.cancel is not None and handle.cancel():
            self._command(Rollback, step_id=step_id)
            raise StepCancelled(f"step {step_id} cancelled before it was published")
        if not ok:
            lost = outcome in ("lost", "timeout") or bool(self.pool.dead())
            self._command(Rollback, step_id=0 if lost else step_id)  # a lost worker: every step in flight
            self._fail(f"step {step_id}", outcome, acks, rolled_back=True)
        try:
            out = self._outputs(handle.seq, handle.greedy, acks)
        except WorkerMessageRejected as exc:
            self._command(Rollback, step_id=step_id)
            raise StepFailed(f"step {step_id} rolled back: {exc}") from None
        self._to_publish.append(step_id)  # told to the workers with the next command (_command)
        self.last_timings = self._timings(acks)
        return out

    def _outputs(self, seq: int, greedy: bool, acks: dict[int, Ack]) -> StageOutput:
        """The exit's output of run ``seq``, from the exit worker's acknowledgement: a greedy step's
        pairs only (its features stay in the worker: ``hidden`` is empty), else the features and,
        where the step has them, the logits."""
        exit_ack = acks[self.owners[-1]]
        if greedy:
            if not exit_ack.pairs:
                raise WorkerMessageRejected(f"run {seq}: the exit worker sent no greedy pairs")
            return StageOutput(torch.empty(0), None, torch.tensor(exit_ack.pairs, dtype=torch.float32))
        if exit_ack.hidden is None:
            raise WorkerMessageRejected(f"run {seq}: the exit worker sent no features")
        return StageOutput(exit_ack.hidden.tensor(), exit_ack.logits.tensor() if exit_ack.logits is not None else None)

    def _timings(self, acks: dict[int, Ack]) -> StepTimings:
        timings = StepTimings()
        for rank in sorted(set(self.owners)):
            timings.stage_s.extend(acks[rank].stage_s)
            if rank != self.owners[0]:
                timings.handoff_s.append(acks[rank].handoff_s)
        return timings

    def _fail(self, what: str, outcome: str, acks: dict[int, Ack], rolled_back: bool = False) -> None:
        """Classify a failed command (``what``: ``step 7``, ``move 3 -> 1``) and raise its typed error
        (a step's rollback is already sent: ``rolled_back``)."""
        undone = " and was rolled back" if rolled_back else ""
        dead = self.pool.dead()
        missing = [r for r in self.pool.members if r not in acks]
        if outcome == "timeout":
            for rank in missing:
                dead.setdefault(rank, f"no answer within {self.timeout_s:g} s (hung)")
        if dead:
            self._lose(dead)
            raise WorkerLost(f"{what} {'rolled back' if rolled_back else 'failed'}: {self._message}")
        failures = [a for a in acks.values() if not a.ok]
        root = next((a for a in failures if not a.aborted), failures[0] if failures else None)
        if missing or any(not _is_typed(a.error_type) for a in failures):
            self._needs_regroup = True  # a communication error may have left the group unusable
        if root is None:
            raise StepFailed(f"{what} failed ({outcome}){undone}")
        cls = getattr(errors, root.error_type, None)
        where = f"worker {root.rank} (stages {self._stages_of(root.rank)})"
        if _is_typed(root.error_type) and isinstance(cls, type):
            raise cls(f"{where}: {root.error}")
        raise StepFailed(f"{what} failed on {where}{undone}: {root.error_type}: {root.error}")

    def _lose(self, dead: dict[int, str]) -> None:
        """Mark ``dead`` lost: kill hung local processes, respawn them (or fail for good)."""
        self._lost.update(dead)
        parts = []
        for rank, why in sorted(dead.items()):
            member = self.pool.members.get(rank)
            stages = self._stages_of(rank)
            where = f"pid {member.pid} on {member.host}" if member else "never joined"
            parts.append(f"worker {rank} ({where}, stages {stages}) is lost: {why}")
            if member is not None:  # should it come back (hung, not dead), it is replaced: it exits
                self.pool.plane.send([(rank, member.incarnation)],  # numbered as the next command, not using it
                                     Exit(seq=self._seq, members=self._members()))
            self.pool.kill(rank)
        self._message = "; ".join(parts)
        if not self.rejoin:
            self._failed = f"{self._message}; not waiting for it to rejoin (restart stagewise)"
            self.pool.plane.wake()  # wait_ready
            return
        self._message += "; requests are refused until it rejoins"
        for rank in dead:
            if self.pool.respawns(rank) and self.respawn and self.respawns < self.max_respawns:
                self.respawns += 1
                self.pool.spawn(rank)

    def rollback(self) -> None:
        """Roll back every step not yet settled (their handles raise :class:`StepFailed`)."""
        with self._lock:
            for handle in self._pending.values():
                handle.error = StepFailed(f"step {handle.step_id} rolled back")
                handle.settled = True
            self._pending.clear()
            if not self._closed:
                self._command(Rollback)

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
        self._refuse()
        with self._lock:
            table = self.stages[0].block_table
            assert table is not None  # described at construction
            check_row_op(cmd, self.batch, table, self.snapshot_entries)
            named = frozenset(cmd.named_rows)
            for handle in [h for h in self._pending.values() if h.rows & named]:
                self._settle(handle)  # its outcome stays with its handle
            self._refuse()
            self._row_ops.append(cmd)

    # ----- health and recovery -------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``status`` (ok | degraded | failed | closed), ``degraded``, ``message``, the data-group
        ``generation`` and one entry per worker (rank, pid, host, stages, alive)."""
        # NOTE: a local worker whose process has exited is reported at once, before the watcher or a step
        # marks it lost: /health must not say ok while the next request's step would find it dead
        exited = {} if self._closed or self._failed else {
            r: f"worker {r}'s process exited (code {self.pool.procs[r].returncode})"
            for r in list(self.pool.members) if r not in self._lost and self.pool.exited(r)}
        status = ("closed" if self._closed else "failed" if self._failed else "degraded" if self._lost or exited
                  else "ok")
        workers = []
        for rank, m in sorted(self.pool.members.items()):
            workers.append({"rank": rank, "pid": m.pid, "host": m.host,
                            "alive": rank not in self._lost and rank not in exited,
                            "local": rank in self.pool.procs,
                            "stages": self._stages_of(rank)})
        message = self._failed or "; ".join([*([self._message] if self._message else []), *exited.values()])
        return {"status": status, "degraded": self.degraded or bool(exited), "message": message,
                "generation": self.gen, "backend": self.backend, "workers": workers}

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until the pipeline is not degraded (True) or ``timeout_s`` passed (False)."""
        self.pool.plane.wait(lambda: not self.degraded or bool(self._failed) or self._closed, timeout_s)
        return not self.degraded

    def _watch(self) -> None:
        """Background: flag lost workers during a step; while idle, notice deaths and rejoins."""
        while not self._closed:
            time.sleep(WATCH_S)
            try:
                seq = self._inflight
                if seq is not None:
                    if self.pool.dead():
                        self._inflight_lost = True
                        self.pool.plane.wake()
                elif self._lost and not self._failed and not self._recovering:
                    if all(self.pool.fresh_join(r) is not None for r in list(self._lost)):
                        self._recovering = True
                        threading.Thread(target=self._recover, name="stagewise-rejoin", daemon=True).start()
                elif not self._lost and not self._failed and self.pool.dead():
                    if self._lock.acquire(blocking=False):  # idle: nobody is stepping
                        try:
                            if (dead := self.pool.dead()) and not self._closed:
                                self._command(Rollback)
                                self._lose(dead)
                        finally:
                            self._lock.release()
            except Exception as exc:  # never let the watcher die silently
                if not self._closed:
                    self._message = f"coordinator watcher: {type(exc).__name__}: {exc}"

    def _recover(self) -> None:
        """Admit the rejoined workers and rebuild the group (runs on its own thread)."""
        try:
            with self._lock:
                if self._closed:
                    return
                fresh = {r: self.pool.fresh_join(r) for r in self._lost}
                joined = {r: rep for r, rep in fresh.items() if rep is not None}
                if len(joined) != len(fresh):
                    return
                for report in joined.values():
                    self.pool.admit(report)
                problems = self._regroup(joined)
                if problems:
                    self._lose(problems)
        except Exception as exc:
            self._message = f"rejoin failed: {type(exc).__name__}: {exc}; still waiting"
        finally:
            self._recovering = False

    def close(self) -> None:
        """Tell every worker to exit, then reap (and if need be kill) the local ones."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self.pool.plane.wake()  # wait_ready
            for handle in self._pending.values():
                handle.error = WorkerLost("the distributed pipeline is closed")
                handle.settled = True
            self._pending.clear()
            members = self.pool.incarnations()
            self.pool.plane.send(members.items(), Exit(seq=self._next_seq(), members=members))
            self.pool.close()


class _RemoteStep(StepHandle):
    """A step sent to the workers; settled (published or rolled back) when its result is asked for."""

    def __init__(self, pipeline: DistributedPipeline, seq: int, step_id: int, rows: frozenset[int],
                 cancel: CancelCheck | None, greedy: bool) -> None:
        super().__init__()
        self.greedy = greedy  # the exit sends each row's greedy pair only
        self.pipeline = pipeline
        self.seq = seq
        self.step_id = step_id
        self.rows = rows
        self.cancel = cancel
        self.settled = False

    def result(self) -> StageOutput:
        self.pipeline._settle(self)
        return super().result()


def _describe(problems: dict[int, str]) -> str:
    return "; ".join(f"worker {rank}: {why}" for rank, why in sorted(problems.items()))


def _is_typed(error_type: str) -> bool:
    cls = getattr(errors, error_type, None)
    return isinstance(cls, type) and issubclass(cls, StagewiseError)

