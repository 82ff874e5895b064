"""The worker process: join a coordinator, load the assigned stages, execute its commands.

``stagewise worker --join HOST:PORT --rank K`` runs :func:`run_worker`. The worker

1. connects to the coordinator's TCPStore and publishes a :class:`JoinReport` (its devices);
   while it waits for its assignment it answers any :class:`LinkProbe` (the coordinator timing
   the links between workers before it plans);
2. waits for its :class:`Assignment`, loads only its stages straight to their devices, joins the
   data process group and acknowledges (``ack/{first_seq - 1}/{rank}``);
3. reads every :class:`Command` in sequence: ``run`` leaves state provisional and acknowledges;
   ``publish`` / ``rollback`` settle it (the coordinator's two-phase decision), for one step
   (``step_id``: several micro-batches may be in flight) or for all (``step_id`` 0); a publish
   decided since the coordinator's last command rides on its next one (``publish``: settled first); ``reset``,
   ``set_blocks`` and ``move`` rearrange state rows and acknowledge; ``regroup``
   rebuilds the data group after another worker was replaced; ``exit`` leaves.

It exits when the coordinator's store disappears (a heartbeat thread notices within seconds),
when told to, or when a command shows it was replaced (declared lost, e.g. after hanging).

Every message it reads or writes is signed with the shared secret for the coordinator's session
(:class:`SealedStore`); a message that fails its signature or its checks is logged and ignored
(the worker keeps waiting for the genuine one), so a process that reaches the store without the
secret cannot make it run, stop or measure anything.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stagewise.errors import StagewiseError, WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.distributed_channel import UpstreamAborted
from stagewise.runtime.distributed_group import join_group, leave_group
from stagewise.runtime.greedy_pairs import greedy_pairs
from stagewise.runtime.link_probe import LinkProbe, probe_key, probe_report_key, run_probe
from stagewise.runtime.sealed_store import SESSION_KEY, SealedStore
from stagewise.runtime.worker_messages import (
    ROW_OPS,
    Ack,
    Assignment,
    Command,
    JoinReport,
    ack_key,
    assign_key,
    cmd_key,
    count_key,
    done_key,
    heartbeat_key,
    join_key,
    out_key,
    tensor_to_bytes,
)
from stagewise.runtime.worker_segment import Opener, WorkerSegment

HEARTBEAT_S = 1.0
IDLE_WAIT = timedelta(days=7)  # a blocking wait on the next command; ends early if the store dies
POLL_S = 0.02  # before the assignment, two keys may come (probe or assignment): poll both


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); raises :class:`WorkerNotJoined` on anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise WorkerNotJoined(f"--join must look like HOST:PORT, got {address!r}")
    return host, int(port)


def connect(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the coordinator's store; :class:`WorkerNotJoined` if it is not reachable."""
    host, port = parse_address(address)
    try:
        return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
    except Exception as exc:
        raise WorkerNotJoined(f"cannot reach the coordinator at {address} within {timeout_s:g} s ({exc})") from None


def _log(rank: int, message: str) -> None:
    print(f"stagewise worker {rank}: {message}", file=sys.stderr, flush=True)


def open_session(raw: dist.Store, secret: bytes, rank: int, timeout_s: float) -> SealedStore:
    """The signed view of the coordinator's store, for its current session (the nonce it published)."""
    try:
        raw.wait([SESSION_KEY], timedelta(seconds=timeout_s))
    except dist.DistStoreError:
        raise WorkerNotJoined(f"the coordinator published no session within {timeout_s:g} s") from None
    session = bytes(raw.get(SESSION_KEY)).decode(errors="replace")
    if len(session) != 32 or any(c not in "0123456789abcdef" for c in session):
        raise WorkerNotJoined(f"the store's session nonce is malformed ({session[:40]!r}); is it a stagewise coordinator?")
    return SealedStore(raw, secret, session, f"worker {rank}")


def read_command(store: SealedStore, seq: int) -> Command:
    """Command ``seq``, once a genuine one is there: a rejected value (forged, unsigned, malformed) is
    logged and waited past (the coordinator's own write replaces it)."""
    key = cmd_key(seq)
    while True:
        store.wait([key], IDLE_WAIT)
        try:
            return store.read(key, lambda b: Command.from_json(b, seq))
        except WorkerMessageRejected:
            time.sleep(POLL_S)


def _heartbeat(address: str, key: str, timeout_s: float) -> None:
    """Bump ``key`` every second; exit the process when the coordinator's store is gone."""
    try:
        store = connect(address, timeout_s)
        while True:
            store.add(key, 1)
            time.sleep(HEARTBEAT_S)
    except BaseException:
        os._exit(4)  # the coordinator is gone: leave no orphan behind


def await_assignment(store: SealedStore, rank: int, incarnation: str) -> Assignment:
    """Wait for this incarnation's :class:`Assignment`, answering every :class:`LinkProbe` that comes
    first (each is deleted once read, so the next probe can use the same key; a probe numbered no
    higher than one already answered is a replay and ignored). Rejected values are logged and skipped."""
    assign, probe = assign_key(rank, incarnation), probe_key(rank, incarnation)
    last_probe = 0
    while True:
        if store.check([assign]):
            try:
                return store.read(assign, Assignment.from_json)
            except WorkerMessageRejected:
                pass
        if store.check([probe]):
            try:
                request = store.read(probe, LinkProbe.from_json)
                if request.n <= last_probe:
                    store.reject(probe, store.raw.get(probe), f"probe {request.n} replayed (answered {last_probe})")
            except WorkerMessageRejected:
                store.delete_key(probe)
                continue
            store.delete_key(probe)
            last_probe = request.n
            store.set(probe_report_key(request.n, rank), run_probe(store.raw, rank, request).to_json())
        else:
            time.sleep(POLL_S)


class Worker:
    """One worker's state across commands."""

    def __init__(self, store: SealedStore, rank: int, incarnation: str, opener: Opener) -> None:
        self.store = store
        self.rank = rank
        self.incarnation = incarnation
        self.opener = opener
        self.segment: WorkerSegment | None = None
        self.assignment: Assignment | None = None

    def _ack(self, seq: int, ack: Ack, expected: int) -> None:
        self.store.set(ack_key(seq, self.rank), ack.to_json())
        if not ack.ok:
            self.store.raw.set(done_key(seq), "fail")
        if self.store.add(count_key(seq), 1) >= expected:
            self.store.raw.set(done_key(seq), "all")

    def _failure(self, exc: BaseException) -> Ack:
        return Ack(self.rank, False, f"{exc}", type(exc).__name__, aborted=isinstance(exc, UpstreamAborted))

    def start(self, assignment: Assignment) -> None:
        """Load the stages, join the data group, acknowledge readiness."""
        self.assignment = assignment
        seq = assignment.first_seq - 1
        try:
            self.segment = WorkerSegment.load(assignment, self.opener)
            self._join(assignment.gen)
            ack = Ack(self.rank, True, measured_bytes=self.segment.measured_bytes())
        except Exception as exc:
            ack = self._failure(exc)
        self._ack(seq, ack, assignment.expected_acks)
        if not ack.ok:
            raise SystemExit(f"stagewise worker {self.rank}: could not start: {ack.error}")
        _log(self.rank, f"ready: stages {[s.index for s in assignment.stages]} (generation {assignment.gen})")

    def _join(self, gen: int) -> None:
        a = self.assignment
        assert a is not None and self.segment is not None
        device = self.segment.stages[0].device if self.segment.stages else torch.device("cpu")
        join_group(self.store.raw, gen, a.data_rank, a.data_world, a.backend, a.timeout_s, device)

    def serve(self) -> int:
        """Execute commands from ``first_seq`` on; returns the exit code."""
        assert self.assignment is not None and self.segment is not None
        seq = self.assignment.first_seq
        while True:
            cmd = read_command(self.store, seq)
            if cmd.members.get(self.rank) != self.incarnation:
                _log(self.rank, "replaced by a newer worker of the same rank (declared lost); exiting")
                return 5
            if cmd.op == "exit":
                return 0
            self._execute(cmd)
            seq += 1

    def _execute(self, cmd: Command) -> None:
        segment = self.segment
        assert segment is not None
        for step_id in cmd.publish:  # published by the coordinator since its last command
            segment.publish(step_id)
        if cmd.op == "run":
            try:
                for op in cmd.ops:  # row operations decided since the last run, in stream order before it
                    segment.rearrange(op)
                result = segment.run(cmd)
                pairs: list[list[float]] = []
                if result.output is not None:
                    logits = result.output.logits
                    if logits is not None and cmd.greedy:  # two numbers a row, computed where the logits are,
                        pairs = greedy_pairs(logits[:, -1])[1].cpu().tolist()  # sent in the acknowledgement
                    else:
                        self.store.set(out_key(cmd.seq, "hidden"), tensor_to_bytes(result.output.hidden))
                        if logits is not None:
                            self.store.set(out_key(cmd.seq, "logits"), tensor_to_bytes(logits))
                ack = Ack(self.rank, True, stage_s=result.stage_s, handoff_s=result.handoff_s, pairs=pairs)
            except Exception as exc:
                ack = self._failure(exc)
            self._ack(cmd.seq, ack, cmd.expected_acks)
        elif cmd.op == "publish":
            segment.publish(cmd.step_id)
        elif cmd.op == "rollback":
            segment.rollback(cmd.step_id)
        elif cmd.op in ROW_OPS:
            try:
                segment.rearrange(cmd)
                ack = Ack(self.rank, True)
            except Exception as exc:
                ack = self._failure(exc)
            self._ack(cmd.seq, ack, cmd.expected_acks)
        elif cmd.op == "regroup":
            try:
                self._join(cmd.gen)
                ack = Ack(self.rank, True)
            except Exception as exc:
                ack = self._failure(exc)
            self._ack(cmd.seq, ack, cmd.expected_acks)


def run_worker(address: str, rank: int, opener: Opener, topology: dict[str, Any], secret: bytes,
               timeout_s: float = 30.0, host: str = "") -> int:
    """Join the coordinator at ``address`` as ``rank`` (>= 1), offering the devices in
    ``topology`` (topology JSON), and serve until told to exit. ``secret``: the one shared with the
    coordinator (every message is signed with it). Returns the exit code."""
    if not 1 <= rank <= 4096:
        raise WorkerNotJoined(f"--rank must be in [1, 4096] (rank 0 is the coordinator), got {rank}")
    store = open_session(connect(address, timeout_s), secret, rank, timeout_s)
    incarnation = uuid.uuid4().hex
    beat = threading.Thread(target=_heartbeat, args=(address, heartbeat_key(rank, incarnation), timeout_s),
                            name="stagewise-heartbeat", daemon=True)
    beat.start()
    report = JoinReport(rank, incarnation, os.getpid(), host or os.uname().nodename, topology)
    worker = Worker(store, rank, incarnation, opener)
    try:
        store.set(join_key(rank), report.to_json())
        _log(rank, f"joined {address}; waiting for an assignment")
        assignment = await_assignment(store, rank, incarnation)
        if assignment.refused:
            store.set(ack_key(0, rank), Ack(rank, False, assignment.refused).to_json())  # "heard you"
            _log(rank, f"not used: {assignment.refused}")
            return 2
        worker.start(assignment)
        return worker.serve()
    except dist.DistNetworkError:
        _log(rank, "the coordinator went away; exiting")
        return 4
    except StagewiseError as exc:
        _log(rank, str(exc))
        return exc.exit_code
    finally:
        if worker.segment is not None:
            worker.segment.close()
        leave_group()
