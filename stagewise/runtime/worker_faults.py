"""WorkerFaults: what has gone wrong with a distributed pipeline's workers, and its typed errors.

A lost worker (process exit, silent heartbeat, no answer in time) leaves the pipeline *degraded*:
requests are refused (:class:`WorkerLost`, HTTP 503) until a worker of the same rank rejoins (local and
Ray workers are respawned, up to ``max_respawns``); with ``rejoin=False`` the pipeline fails for good
instead. A worker's typed error is raised as its own type; anything else as :class:`StepFailed`, and a
communication error may have left the data group unusable (``needs_regroup``).
"""

from __future__ import annotations

from typing import Any

from stagewise import errors
from stagewise.errors import StagewiseError, StepFailed, WorkerLost
from stagewise.runtime.worker_commands import WorkerCommands
from stagewise.runtime.worker_layout import WorkerLayout
from stagewise.runtime.worker_messages import Ack
from stagewise.runtime.worker_pool import WorkerPool


class WorkerFaults:
    """The fault state of ``pool``'s workers laid out as ``layout`` (see the module doc)."""

    def __init__(self, pool: WorkerPool, layout: WorkerLayout, rejoin: bool, respawn: bool) -> None:
        self.pool = pool
        self.layout = layout
        self.rejoin = rejoin
        self.respawn = respawn
        self.max_respawns = 5
        self.respawns = 0
        self.lost: dict[int, str] = {}  # rank -> why, until it rejoins
        self.failed = ""  # why the pipeline failed for good
        self.message = ""  # what health() says is wrong
        self.needs_regroup = False  # rebuild the data group before the next step
        self.closed = False

    @property
    def degraded(self) -> bool:
        return bool(self.lost or self.failed or self.closed)

    def refuse(self) -> None:
        """Raise :class:`WorkerLost` while the pipeline cannot take work."""
        if self.closed:
            raise WorkerLost("the distributed pipeline is closed")
        if self.failed:
            raise WorkerLost(self.failed)
        if self.lost:
            raise WorkerLost(self.message or f"workers {sorted(self.lost)} are lost; waiting for them to rejoin")

    def healed(self) -> None:
        """The data group is whole again (every worker answered a regroup)."""
        self.needs_regroup = False
        self.lost.clear()
        self.message = ""

    def raise_for(self, commands: WorkerCommands, what: str, outcome: str, acks: dict[int, Ack],
                  rolled_back: bool = False) -> None:
        """Classify a failed command (``what``: ``step 7``, ``move 3 -> 1``; ``outcome`` and ``acks`` as
        :meth:`WorkerCommands.collect` returns them) and raise its typed error (a step's rollback is
        already sent: ``rolled_back``)."""
        undone = " and was rolled back" if rolled_back else ""
        dead = self.pool.dead()
        missing = [r for r in self.pool.members if r not in acks]
        if outcome == "timeout":
            for rank in missing:
                dead.setdefault(rank, f"no answer within {self.layout.timeout_s:g} s (hung)")
        if dead:
            self.lose(commands, dead)
            raise WorkerLost(f"{what} {'rolled back' if rolled_back else 'failed'}: {self.message}")
        failures = [a for a in acks.values() if not a.ok]
        root = next((a for a in failures if not a.aborted), failures[0] if failures else None)
        if missing or any(not is_typed(a.error_type) for a in failures):
            self.needs_regroup = True  # a communication error may have left the group unusable
        if root is None:
            raise StepFailed(f"{what} failed ({outcome}){undone}")
        cls = getattr(errors, root.error_type, None)
        where = f"worker {root.rank} (stages {self.layout.stages_of(root.rank)})"
        if is_typed(root.error_type) and isinstance(cls, type):
            raise cls(f"{where}: {root.error}")
        raise StepFailed(f"{what} failed on {where}{undone}: {root.error_type}: {root.error}")

    def lose(self, commands: WorkerCommands, dead: dict[int, str]) -> None:
        """Mark ``dead`` (rank -> why) lost: tell them to exit, kill hung local processes, respawn them
        (or fail for good)."""
        self.lost.update(dead)
        parts = []
        for rank, why in sorted(dead.items()):
            member = self.pool.members.get(rank)
            where = f"pid {member.pid} on {member.host}" if member else "never joined"
            parts.append(f"worker {rank} ({where}, stages {self.layout.stages_of(rank)}) is lost: {why}")
            if member is not None:  # should it come back (hung, not dead), it is replaced: it exits
                commands.tell_exit(rank, member.incarnation)
            self.pool.kill(rank)
        self.message = "; ".join(parts)
        if not self.rejoin:
            self.failed = f"{self.message}; not waiting for it to rejoin (restart stagewise)"
            self.pool.plane.wake()  # wait_ready
            return
        self.message += "; requests are refused until it rejoins"
        for rank in dead:
            if self.pool.respawns(rank) and self.respawn and self.respawns < self.max_respawns:
                self.respawns += 1
                self.pool.spawn(rank)

    def health(self, generation: int) -> dict[str, Any]:
        """``status`` (ok | degraded | failed | closed), ``degraded``, ``message``, the data-group
        ``generation`` and one entry per worker (rank, pid, host, stages, alive)."""
        # NOTE: a local worker whose process has exited is reported at once, before the watcher or a step
        # marks it lost: /health must not say ok while the next request's step would find it dead
        exited = {} if self.closed or self.failed else {
            r: f"worker {r}'s process exited (code {self.pool.procs[r].returncode})"
            for r in list(self.pool.members) if r not in self.lost and self.pool.exited(r)}
        status = ("closed" if self.closed else "failed" if self.failed else "degraded" if self.lost or exited
                  else "ok")
        workers = []
        for rank, m in sorted(self.pool.members.items()):
            workers.append({"rank": rank, "pid": m.pid, "host": m.host,
                            "alive": rank not in self.lost and rank not in exited,
                            "local": rank in self.pool.procs,
                            "stages": self.layout.stages_of(rank)})
        message = self.failed or "; ".join([*([self.message] if self.message else []), *exited.values()])
        return {"status": status, "degraded": self.degraded or bool(exited), "message": message,
                "generation": generation, "backend": self.layout.backend, "workers": workers}


def describe(problems: dict[int, str]) -> str:
    """``problems`` (rank -> why) as one line."""
    return "; ".join(f"worker {rank}: {why}" for rank, why in sorted(problems.items()))


def is_typed(error_type: str) -> bool:
    """Whether a worker's error type names one of our typed errors (the user's mistake, not a fault)."""
    cls = getattr(errors, error_type, None)
    return isinstance(cls, type) and issubclass(cls, StagewiseError)
