"""Drain: an engine's shutdown under way — refuse new requests, let the rest finish, cancel them at a deadline.

One implementation for both ways the engine runs: the thread that takes the engine's turns (its own worker,
or the engine process's loop) calls :meth:`Drain.turn` after each one, which cancels what still runs once
the deadline has passed and reports the drain done once nothing does. Whoever began it may wait for that
(:meth:`Drain.wait`, the in-process :meth:`Engine.drain`) or hear it from the turn (the engine process,
which then says so to the API process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Drain:
    """A drain begun ``grace_s`` before its deadline (monotonic). ``clean``: no request was cancelled at the
    deadline (everything finished within the grace)."""

    def __init__(self, grace_s: float) -> None:
        self.deadline_s = time.monotonic() + grace_s
        self.clean = True
        self.done = threading.Event()

    def hurry(self) -> None:
        """A second drain (a second signal): cancel what still runs at the next turn."""
        self.deadline_s = 0.0

    def turn(self, busy: bool, cancel_all: Callable[[], None]) -> bool | None:
        """After one engine turn, by the thread that takes them. ``busy``: requests still wait or run;
        ``cancel_all`` cancels them (they end as cancelled in the next turns). Returns ``clean`` the first
        time the drain is done (nothing runs any more), else None."""
        if self.done.is_set():
            return None
        if busy:
            if self.clean and time.monotonic() >= self.deadline_s:
                self.clean = False
                cancel_all()
            return None
        self.done.set()
        return self.clean

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` (None: for ever) for the drain to be done; True once it is."""
        return self.done.wait(timeout_s)
