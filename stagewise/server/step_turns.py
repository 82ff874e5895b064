"""StepTurns: the HTTP event loop handles its ready I/O between the engine's steps, not during them.

One process holds both threads, and only one runs Python at a time. On CPU stages the engine's step
is Python between torch calls; at every call it gives the GIL up, and each time the loop thread has
it, the step waits for it back (up to the 5 ms switch interval). So the loop's share grew with the
traffic: a client opening connections or sending bodies in a tight loop took the time the running
streams' steps needed (a 200-token stream 5x its time alone on a 2-core machine, bench/soak.py).
Here the loop, woken with ready I/O while a step runs, lets that step end first (waiting at most
``max_wait_s``, the GIL released), then handles what is ready: at most one iteration per step while
the engine is busy (a closed-loop client is slowed to the pace of the steps), none of its time while
the engine is idle. GPU stages release the GIL for their kernels; the server takes turns only on CPU.
"""

from __future__ import annotations

import selectors
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class StepTurns:
    """Shared by the engine thread (:meth:`step`) and the event loop's :class:`TurnTakingSelector`."""

    def __init__(self, max_wait_s: float = 0.02) -> None:
        self.max_wait_s = max_wait_s
        self._stepped = threading.Condition()
        self._stepping = False

    @contextmanager
    def step(self) -> Iterator[None]:
        """Around one engine step, on the engine thread."""
        with self._stepped:
            self._stepping = True
        try:
            yield
        finally:
            with self._stepped:
                self._stepping = False
                self._stepped.notify_all()

    def after_step(self) -> None:
        """Return once no step runs, or after ``max_wait_s`` (the event loop, with ready I/O)."""
        with self._stepped:
            self._stepped.wait_for(lambda: not self._stepping, self.max_wait_s)


class TurnTakingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The event loop's selector: its ready events are returned after the engine's step under way."""

    def __init__(self, turns: StepTurns) -> None:
        super().__init__()
        self.turns = turns

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[Any] = super().select(timeout)
        self.turns.after_step()
        return events
