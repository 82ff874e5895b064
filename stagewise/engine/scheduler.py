"""Scheduler: a bounded FIFO of waiting requests and the set running on the pipeline.

The engine loop is ``schedule() → execute() → update()`` (vLLM v1's shape): ``schedule`` admits
waiting requests while sequence slots are free (``max_running``, the pipeline's slots), ``execute``
is one :class:`~stagewise.engine.batcher.Batcher` iteration over every running sequence, and
``update`` frees the slots of the requests that finished.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from stagewise.engine.request_handle import RequestHandle
from stagewise.errors import StagewiseError


class QueueFull(StagewiseError):
    """The waiting queue is full; the client should retry later."""

    http_status = 429
    code = "queue_full"
    retry_after_s = 1


class EngineClosed(StagewiseError):
    """The engine stopped accepting requests (loading, draining or shut down)."""

    http_status = 503
    code = "unavailable"


@dataclass(frozen=True)
class Batch:
    """What to execute next, and queued requests that were cancelled before they ran."""

    run: tuple[RequestHandle, ...]
    dropped: tuple[RequestHandle, ...] = ()


class Scheduler:
    """Thread-safe FIFO admission: at most ``max_running`` running, and at most ``max_waiting`` waiting
    beyond the slots free now.

    A request that a free slot can take is never refused: the bound counts only the requests that
    would wait for a slot to free (``--queue`` past ``--max-seqs``), whether or not the engine's
    worker has moved the others to running yet (it does so between steps, but counting them does not
    wait for that). A request cancelled while waiting (its client went away) leaves the queue at once.
    """

    def __init__(self, max_waiting: int, max_running: int = 1) -> None:
        if max_waiting < 1 or max_running < 1:
            raise ValueError("max_waiting and max_running must be >= 1")
        self.max_waiting = max_waiting
        self.max_running = max_running
        self._waiting: deque[RequestHandle] = deque()
        self._running: list[RequestHandle] = []
        self._dropped: list[RequestHandle] = []  # cancelled while waiting: reported by the next schedule()
        self._closed = False
        self._cond = threading.Condition()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def beyond_slots(self) -> int:
        """Waiting requests that no free slot can take (what ``max_waiting`` bounds)."""
        with self._cond:
            return self._beyond_slots()

    def _free_slots(self) -> int:
        return max(0, self.max_running - len(self._running))

    def _beyond_slots(self) -> int:
        return max(0, len(self._waiting) - self._free_slots())

    @property
    def running(self) -> int:
        with self._cond:
            return len(self._running)

    def add(self, handle: RequestHandle) -> None:
        """Queue ``handle``. Raises :class:`QueueFull` or :class:`EngineClosed`."""
        with self._cond:
            if self._closed:
                raise EngineClosed("the server is shutting down and accepts no new requests")
            self._drop_cancelled()
            if self._beyond_slots() >= self.max_waiting:  # this one would wait past the bound
                raise QueueFull(f"the request queue is full ({self.max_waiting} waiting for a sequence slot, "
                                f"{self.max_running} running); retry later")
            self._waiting.append(handle)
            handle.on_cancel = lambda: self._withdraw(handle)
            self._cond.notify_all()

    def _withdraw(self, handle: RequestHandle) -> None:
        """``handle`` was cancelled: if it still waits, it leaves the queue now (reported by the next
        :meth:`schedule` as dropped, which this wakes)."""
        with self._cond:
            if handle in self._waiting:
                self._waiting.remove(handle)
                self._dropped.append(handle)
                self._cond.notify_all()

    def close(self) -> None:
        """Refuse new requests from now on; queued ones still run."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def schedule(self, timeout_s: float, free: int | None = None) -> Batch:
        """Move the oldest waiting requests to running (FIFO), at most ``free`` of them (default: up to
        ``max_running`` running); waits up to ``timeout_s`` for one."""
        with self._cond:
            if not self._waiting and timeout_s > 0:
                self._cond.wait(timeout_s)
            self._drop_cancelled()
            dropped, self._dropped = self._dropped, []
            run: list[RequestHandle] = []
            room = self.max_running - len(self._running) if free is None else min(free, self.max_running - len(self._running))
            while self._waiting and len(run) < room:
                handle = self._waiting.popleft()
                handle.on_cancel = None  # it runs now: the batcher notices its cancellation
                (dropped if handle.is_cancelled() else run).append(handle)
            self._running.extend(run)
            return Batch(tuple(run), tuple(dropped))

    def _drop_cancelled(self) -> None:
        """Take requests cancelled while waiting (their clients went away) out of the queue, so they
        hold no queue place; the caller holds the lock."""
        if any(handle.is_cancelled() for handle in self._waiting):
            self._dropped.extend(handle for handle in self._waiting if handle.is_cancelled())
            self._waiting = deque(handle for handle in self._waiting if not handle.is_cancelled())

    def update(self, batch: Batch) -> None:
        """The batch's requests finished: free their slots."""
        self.finish(*batch.run)

    def finish(self, *handles: RequestHandle) -> None:
        """``handles`` finished: free their slots."""
        with self._cond:
            self._running = [h for h in self._running if h not in handles]
            self._cond.notify_all()

    def cancel_all(self) -> None:
        """Cancel every waiting and running request (they finish as ``cancelled``)."""
        with self._cond:
            for handle in (*self._waiting, *self._running):
                handle.cancel()
            self._cond.notify_all()

    def idle(self) -> bool:
        with self._cond:
            return not self._waiting and not self._running and not self._dropped
