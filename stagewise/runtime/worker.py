"""The worker process: join a coordinator, load the assigned stages, execute its commands.

``stagewise worker --join HOST:PORT --rank K`` runs :func:`run_worker`. The worker

1. connects to the coordinator's rendezvous store, reads the session and the control plane's signed
   port there, connects to the plane (:class:`WorkerPlane`) and sends a :class:`JoinReport` (its
   devices); while it waits for its assignment it answers any :class:`ProbeRequest` (the coordinator
   timing the links between workers before it plans);
2. on its :class:`Assignment` loads only its stages straight to their devices, joins the data
   process group (rendezvous through the store) and acknowledges (as command ``first_seq - 1``);
3. executes every :data:`Command` in ``seq`` order: :class:`Run` applies the row operations it
   carries, leaves the step provisional and acknowledges; :class:`Publish` / :class:`Rollback`
   settle it (the coordinator's two-phase decision), for one step (several micro-batches may be in
   flight) or for all; a publish decided since the coordinator's last command rides on its next
   one; :class:`Regroup` rebuilds the data group after another worker was replaced; :class:`Exit`
   leaves.

It exits when the coordinator disappears (the heartbeat connection drops), when told to, or when a
command shows it was replaced (declared lost, e.g. after hanging).

A message that fails its signature or its checks, or replays an earlier command, is logged and
ignored (nothing of it is applied), so a process that reaches the worker without the secret cannot
make it run, stop or measure anything.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stagewise.errors import StagewiseError, WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.distributed_channel import UpstreamAborted
from stagewise.runtime.distributed_group import join_group, leave_group
from stagewise.runtime.greedy_pairs import read_greedy_pairs
from stagewise.runtime.link_probe import run_probe
from stagewise.runtime.tensor_blob import TensorBlob
from stagewise.runtime.worker_messages import (
    Ack,
    Assignment,
    Command,
    Exit,
    JoinReport,
    ProbeDone,
    ProbeRequest,
    Publish,
    Regroup,
    Rollback,
    Run,
)
from stagewise.runtime.worker_plane import SESSION_KEY, WorkerPlane, plane_port
from stagewise.runtime.worker_segment import Opener, WorkerSegment

SPIN_S = 20e-6  # while a greedy run's device works, how often the worker looks for the next command


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); raises :class:`WorkerNotJoined` on anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise WorkerNotJoined(f"--join must look like HOST:PORT, got {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def connect(address: str, timeout_s: float) -> dist.TCPStore:
    """A client of the coordinator's store; :class:`WorkerNotJoined` if it is not reachable."""
    host, port = parse_address(address)
    try:
        return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))
    except Exception as exc:
        raise WorkerNotJoined(f"cannot reach the coordinator at {address} within {timeout_s:g} s ({exc})") from None


def _log(rank: int, message: str) -> None:
    print(f"stagewise worker {rank}: {message}", file=sys.stderr, flush=True)


def read_session(raw: dist.Store, timeout_s: float) -> str:
    """The coordinator's session nonce, published in its store."""
    try:
        raw.wait([SESSION_KEY], timedelta(seconds=timeout_s))
    except dist.DistStoreError:
        raise WorkerNotJoined(f"the coordinator published no session within {timeout_s:g} s") from None
    session = bytes(raw.get(SESSION_KEY)).decode(errors="replace")
    if len(session) != 32 or any(c not in "0123456789abcdef" for c in session):
        raise WorkerNotJoined(f"the store's session nonce is malformed ({session[:40]!r}); is it a stagewise coordinator?")
    return session


def receive(plane: WorkerPlane) -> Any:
    """The next genuine message (rejected ones are logged by the plane and read past)."""
    while True:
        try:
            return plane.receive()
        except WorkerMessageRejected:
            continue


def await_assignment(plane: WorkerPlane, store: dist.Store) -> Assignment:
    """Wait for this incarnation's :class:`Assignment`, answering every :class:`ProbeRequest` that
    comes first (a probe numbered no higher than one already answered is a replay and ignored);
    anything else, or addressed to another incarnation, is logged and ignored."""
    last_probe = 0
    while True:
        message = receive(plane)
        if isinstance(message, Assignment) and message.incarnation == plane.incarnation:
            return message
        if isinstance(message, ProbeRequest) and message.incarnation == plane.incarnation:
            if message.probe.n <= last_probe:
                _log(plane.rank, f"rejected a message: probe {message.probe.n} replayed (answered {last_probe})")
                continue
            last_probe = message.probe.n
            report = run_probe(store, plane.rank, message.probe)
            plane.send(ProbeDone(incarnation=plane.incarnation, n=message.probe.n, report=report))
            continue
        _log(plane.rank, f"rejected a message: {type(message).__name__} before an assignment (ignored)")


class Worker:
    """One worker's state across commands."""

    def __init__(self, plane: WorkerPlane, store: dist.Store, opener: Opener) -> None:
        self.plane = plane
        self.store = store
        self.rank = plane.rank
        self.incarnation = plane.incarnation
        self.opener = opener
        self.segment: WorkerSegment | None = None
        self.assignment: Assignment | None = None

    def _ack(self, seq: int, ok: bool = True, **fields: Any) -> None:
        self.plane.send(Ack(seq=seq, rank=self.rank, incarnation=self.incarnation, ok=ok, **fields))

    def _fail(self, seq: int, exc: BaseException) -> None:
        self._ack(seq, False, error=f"{exc}"[:60_000], error_type=type(exc).__name__,
                  aborted=isinstance(exc, UpstreamAborted))

    def start(self, assignment: Assignment) -> None:
        """Load the stages, join the data group, acknowledge readiness."""
        self.assignment = assignment
        seq = assignment.first_seq - 1
        try:
            self.segment = WorkerSegment.load(assignment, self.opener)
            self._join(assignment.gen)
        except Exception as exc:
            self._fail(seq, exc)
            raise SystemExit(f"stagewise worker {self.rank}: could not start: {exc}") from None
        self._ack(seq, measured_bytes=self.segment.measured_bytes())
        _log(self.rank, f"ready: stages {[s.index for s in assignment.stages]} (generation {assignment.gen})")

    def _join(self, gen: int) -> None:
        a = self.assignment
        assert a is not None and self.segment is not None
        device = self.segment.stages[0].device if self.segment.stages else torch.device("cpu")
        join_group(self.store, gen, a.data_rank, a.data_world, a.backend, a.timeout_s, device)

    def serve(self) -> int:
        """Execute commands from ``first_seq`` on, in order; returns the exit code. A command numbered
        no higher than the last one executed is a replay: logged and ignored.

        A greedy run's acknowledgement waits for its device (the pairs it carries); when the next run,
        already here, reads that run's kept tokens, it is launched first, so the device goes from one
        step to the next without waiting for this process (the acknowledgements still go in order)."""
        assert self.assignment is not None and self.segment is not None
        last = self.assignment.first_seq - 1
        held: Held | None = None  # a launched greedy run whose acknowledgement is not sent yet
        while True:
            if held is not None:
                while not held.done() and not self.plane.ready():
                    time.sleep(SPIN_S)  # NOTE: a core spins while the device runs, so a run that comes is launched at once
                if not self.plane.ready():
                    held.send()  # nothing to launch first: acknowledge
                    held = None
            try:
                cmd = self.plane.receive()
            except WorkerMessageRejected:
                continue  # logged by the plane; a held acknowledgement is not kept waiting for a genuine one
            if not isinstance(cmd, Command) or cmd.seq <= last:
                what = f"command {cmd.seq} replayed (last {last})" if isinstance(cmd, Command) else type(cmd).__name__
                _log(self.rank, f"rejected a message: {what}")
                continue
            if cmd.members.get(self.rank) != self.incarnation:
                _log(self.rank, "replaced by a newer worker of the same rank (declared lost); exiting")
                if held is not None:
                    held.send()
                return 5
            if held is not None and not (isinstance(cmd, Run) and cmd.tokens_of == held.step_id):
                held.send()  # every other command sees the run acknowledged before it
                held = None
            if isinstance(cmd, Exit):
                return 0
            if cmd.seq != last + 1:
                _log(self.rank, f"command {cmd.seq} after {last}: commands were missed; exiting")
                return 5
            last = cmd.seq
            launched = self._execute(cmd)
            if held is not None:
                held.send()  # the run that reads its tokens is launched: now wait for its device
            held = launched

    def _execute(self, cmd: Command) -> Held | None:
        """Execute ``cmd`` and acknowledge it, but for a greedy run whose pairs are still on the device:
        returned, to :meth:`Held.send` once the next command was looked at."""
        segment = self.segment
        assert segment is not None
        for step_id in cmd.publish:  # published by the coordinator since its last command
            segment.publish(step_id)
        if isinstance(cmd, Run):
            try:
                for op in cmd.ops:  # row operations decided since the last run, in stream order before it
                    segment.rearrange(op)
                result = segment.run(cmd)
                outputs: dict[str, Any] = {}
                if result.output is not None:
                    logits = result.output.logits
                    if logits is not None and cmd.greedy:  # two numbers a row, computed where the logits are
                        tokens, pairs, ready = read_greedy_pairs(logits[:, -1])  # the host copy on a side stream
                        segment.keep_tokens(cmd.step_id, tokens)  # the next step over these rows may read them here
                        return Held(self, cmd.seq, cmd.step_id, pairs, ready, result.stage_s, result.handoff_s)
                    outputs["hidden"] = TensorBlob.of(result.output.hidden)
                    outputs["logits"] = TensorBlob.of(logits) if logits is not None else None
            except Exception as exc:
                self._fail(cmd.seq, exc)
                return None
            self._ack(cmd.seq, stage_s=result.stage_s, handoff_s=result.handoff_s, **outputs)
        elif isinstance(cmd, Publish):
            segment.publish(cmd.step_id)
        elif isinstance(cmd, Rollback):
            segment.rollback(cmd.step_id)
        elif isinstance(cmd, Regroup):
            try:
                self._join(cmd.gen)
            except Exception as exc:
                self._fail(cmd.seq, exc)
                return None
            self._ack(cmd.seq)
        return None


class Held:
    """A launched greedy run of ``worker``'s (command ``seq``, step ``step_id``) whose acknowledgement waits
    for the host copy of its ``pairs`` ``(P, 2)``, complete at event ``ready`` (None: already)."""

    def __init__(self, worker: Worker, seq: int, step_id: int, pairs: torch.Tensor, ready: Any,
                 stage_s: list[float], handoff_s: float) -> None:
        self.worker, self.seq, self.step_id = worker, seq, step_id
        self.pairs, self.ready, self.stage_s, self.handoff_s = pairs, ready, stage_s, handoff_s

    def done(self) -> bool:
        """Whether the pairs are on the host (:meth:`send` would not wait)."""
        return self.ready is None or bool(self.ready.query())

    def send(self) -> None:
        """Read the pairs (waiting for the device) and acknowledge the run (or its failure)."""
        try:
            if self.ready is not None:
                self.ready.synchronize()
            pairs = [tuple(p) for p in self.pairs.tolist()]
        except Exception as exc:  # NOTE: an asynchronous device error surfaces here, on the run that launched it
            self.worker._fail(self.seq, exc)
            return
        self.worker._ack(self.seq, stage_s=self.stage_s, handoff_s=self.handoff_s, pairs=pairs)


def run_worker(address: str, rank: int, opener: Opener, topology: dict[str, Any], secret: bytes,
               timeout_s: float = 30.0, host: str = "") -> int:
    """Join the coordinator at ``address`` (its rendezvous store) as ``rank`` (>= 1), offering the
    devices in ``topology`` (topology JSON), and serve until told to exit. ``secret``: the one shared
    with the coordinator (every message is signed with it). Returns the exit code."""
    if not 1 <= rank <= 4096:
        raise WorkerNotJoined(f"--rank must be in [1, 4096] (rank 0 is the coordinator), got {rank}")
    store = connect(address, timeout_s)
    session = read_session(store, timeout_s)
    port = plane_port(store, secret, session, timeout_s)
    incarnation = uuid.uuid4().hex
    plane = WorkerPlane(parse_address(address)[0], port, secret, session, rank, incarnation)
    plane.start_heartbeat(timeout_s)
    worker = Worker(plane, store, opener)
    try:
        plane.send(JoinReport(rank=rank, incarnation=incarnation, pid=os.getpid(), host=host or os.uname().nodename,
                              topology=topology))
        _log(rank, f"joined {address}; waiting for an assignment")
        assignment = await_assignment(plane, store)
        if assignment.refused:
            worker._ack(0, False, error="heard you")
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
        plane.leaving.set()
        if worker.segment is not None:
            worker.segment.close()
        leave_group()
        plane.close()
