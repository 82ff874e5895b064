"""WorkerCommands: the coordinator's numbered commands to its workers and the wait for their acknowledgements.

Every command goes to every member worker (lost ones aside) on the pool's control plane, numbered in
one order; :class:`Run` and :class:`Regroup` are acknowledged (``ACKNOWLEDGED``), the others not. The
steps published since the last command ride on the next one (``publish``): the workers publish them
first, with no command of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from stagewise.runtime.worker_messages import ACKNOWLEDGED, Ack, Command, Exit
from stagewise.runtime.worker_pool import WorkerPool

FAIL_GRACE_S = 2.0  # after one worker fails, how long the others get to report


class WorkerCommands:
    """Commands to ``pool``'s workers, except those ``lost()`` names (see the module doc)."""

    def __init__(self, pool: WorkerPool, lost: Callable[[], Collection[int]]) -> None:
        self.pool = pool
        self._lost = lost
        self.seq = 0  # the next command's number
        self.to_publish: list[int] = []  # steps published here, told to the workers with the next command
        self.inflight: int | None = None  # the command whose acknowledgements are awaited now
        self.inflight_lost = False  # the watcher found a worker dead while they were

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def members(self) -> dict[int, str]:
        """The workers commands go to (rank -> incarnation)."""
        lost = self._lost()
        return {r: inc for r, inc in self.pool.incarnations().items() if r not in lost}

    def send(self, kind: type[Command], **fields: Any) -> int:
        """Send a ``kind`` command to every member (a :class:`Run` or :class:`Regroup` awaited: its
        acknowledgements are counted from now), the steps published since the last command with it.
        Returns its number."""
        seq = self.next_seq()
        publish, self.to_publish = self.to_publish, []
        members = self.members()
        if kind in ACKNOWLEDGED:
            self.pool.plane.expect(seq, members)
        self.pool.plane.send(members.items(), kind(seq=seq, members=members, publish=publish, **fields))
        return seq

    def tell_exit(self, rank: int, incarnation: str) -> None:
        """Tell one worker incarnation to exit (numbered as the next command, not using its number)."""
        self.pool.plane.send([(rank, incarnation)], Exit(seq=self.seq, members=self.members()))

    def exit_all(self) -> None:
        """Tell every worker incarnation the pool knows, lost ones included, to exit."""
        members = self.pool.incarnations()
        self.pool.plane.send(members.items(), Exit(seq=self.next_seq(), members=members))

    def collect(self, seq: int, timeout_s: float) -> tuple[str, dict[int, Ack]]:
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
            return "lost" if self.inflight_lost else None

        self.inflight, self.inflight_lost = seq, False
        try:
            plane.wait(lambda: outcome() is not None, timeout_s)
            result = outcome() or "timeout"
            if result == "fail" and not self.pool.dead():  # the others abort quickly unless stuck on a lost peer
                plane.wait(lambda: all(r in plane.acks(seq) for r in ranks) or self.inflight_lost, FAIL_GRACE_S)
        finally:
            self.inflight = None
        return result, plane.forget(seq)

    def notice_dead(self) -> None:
        """The watcher, while acknowledgements are awaited: a dead worker ends the wait as ``lost``."""
        if self.inflight is not None and self.pool.dead():
            self.inflight_lost = True
            self.pool.plane.wake()
