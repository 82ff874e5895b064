"""WorkerRecovery: (re)forming a distributed pipeline's data group, and the watcher that notices losses and rejoins.

Each data-group generation starts with a regroup: surviving workers rebuild the group, fresh ones (at
start, or rejoined after a loss) load their stages from their assignment and join it; every worker
acknowledges. A watcher thread ends a wait for acknowledgements when a worker dies during it; while
nobody steps, it notices deaths (rolling back and marking them lost) and, once every lost rank has
rejoined, recovers on a thread of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from stagewise.runtime.remote_stage import RemoteStage
from stagewise.runtime.worker_commands import WorkerCommands
from stagewise.runtime.worker_faults import WorkerFaults
from stagewise.runtime.worker_layout import WorkerLayout
from stagewise.runtime.worker_messages import JoinReport, Regroup, Rollback
from stagewise.runtime.worker_pool import WorkerPool

WATCH_S = 0.2  # how often the watcher looks for dead workers (process exits, silent heartbeats)


class WorkerRecovery:
    """Regroups ``pool``'s workers (``load_timeout_s`` bounds loading and joining) and watches them; steps
    and recovery take turns under ``lock`` (see the module doc)."""

    def __init__(self, pool: WorkerPool, layout: WorkerLayout, commands: WorkerCommands, faults: WorkerFaults,
                 stages: Sequence[RemoteStage], lock: threading.RLock, load_timeout_s: float) -> None:
        self.pool, self.layout, self.commands, self.faults = pool, layout, commands, faults
        self.stages = stages
        self.lock = lock
        self.load_timeout_s = load_timeout_s
        self.gen = -1  # the data group's generation
        self._watcher: threading.Thread | None = None
        self._recovering = False

    def watch(self) -> None:
        """Start the watcher thread (it ends once the faults say closed)."""
        self._watcher = threading.Thread(target=self._watch, name="stagewise-coordinator", daemon=True)
        self._watcher.start()

    def regroup(self, fresh: dict[int, JoinReport]) -> dict[int, str]:
        """New generation: survivors rebuild the data group, ``fresh`` workers load and join it.

        Returns the workers that failed to (rank -> why); empty when the group is whole again."""
        self.gen += 1
        seq = self.commands.next_seq()
        members = self.pool.incarnations()
        survivors = {r: inc for r, inc in members.items() if r not in fresh}
        self.pool.plane.expect(seq, members)
        if survivors:
            self.pool.plane.send(survivors.items(), Regroup(seq=seq, members=members, gen=self.gen))
        for rank, report in fresh.items():
            assignment = self.layout.assignment(rank, report.incarnation, self.gen, seq + 1, self.pool.count)
            self.pool.plane.send([(rank, report.incarnation)], assignment)
        _, acks = self.commands.collect(seq, self.load_timeout_s)
        problems = {r: f"{a.error_type}: {a.error}" for r, a in acks.items() if not a.ok}
        dead = self.pool.dead()
        for rank in self.pool.members:
            if rank not in acks:
                problems[rank] = dead.get(rank, f"not ready within {self.load_timeout_s:g} s")
        if problems:
            return problems
        for stage in self.stages:
            mine = self.layout.stages_of(stage.rank)
            sizes = acks[stage.rank].measured_bytes
            if stage.rank in fresh and len(sizes) == len(mine):
                stage.reported_bytes = sizes[mine.index(stage.spec.index)]
        self.faults.healed()
        self.pool.plane.wake()  # wait_ready
        return {}

    def _watch(self) -> None:
        """Background: flag lost workers during a step; while idle, notice deaths and rejoins."""
        faults = self.faults
        while not faults.closed:
            time.sleep(WATCH_S)
            try:
                if self.commands.inflight is not None:
                    self.commands.notice_dead()
                elif faults.lost and not faults.failed and not self._recovering:
                    if all(self.pool.fresh_join(r) is not None for r in list(faults.lost)):
                        self._recovering = True
                        threading.Thread(target=self._recover, name="stagewise-rejoin", daemon=True).start()
                elif not faults.lost and not faults.failed and self.pool.dead():
                    if self.lock.acquire(blocking=False):  # idle: nobody is stepping
                        try:
                            if (dead := self.pool.dead()) and not faults.closed:
                                self.commands.send(Rollback)
                                faults.lose(self.commands, dead)
                        finally:
                            self.lock.release()
            except Exception as exc:  # never let the watcher die silently
                if not faults.closed:
                    faults.message = f"coordinator watcher: {type(exc).__name__}: {exc}"

    def _recover(self) -> None:
        """Admit the rejoined workers and rebuild the group (runs on its own thread)."""
        faults = self.faults
        try:
            with self.lock:
                if faults.closed:
                    return
                fresh = {r: self.pool.fresh_join(r) for r in faults.lost}
                joined = {r: rep for r, rep in fresh.items() if rep is not None}
                if len(joined) != len(fresh):
                    return
                for report in joined.values():
                    self.pool.admit(report)
                problems = self.regroup(joined)
                if problems:
                    faults.lose(self.commands, problems)
        except Exception as exc:
            faults.message = f"rejoin failed: {type(exc).__name__}: {exc}; still waiting"
        finally:
            self._recovering = False
