"""RequestHandle: the engine's mutable record of one submitted request, shared with its client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_output import RequestOutput

OutputSink = Callable[[RequestOutput], None]


class RequestHandle:
    """Links a request to whoever waits for it.

    The engine calls ``sink`` (from its worker thread) with every :class:`RequestOutput`, the
    last one finished. The client calls :meth:`cancel` from any thread; the engine notices it
    before the next step, or between stages of a running step, and reports ``cancelled``.
    """

    def __init__(self, request: EngineRequest, sink: OutputSink) -> None:
        self.request = request
        self._sink = sink
        self._cancelled = threading.Event()
        self._done = threading.Event()
        self.submitted_s = time.monotonic()
        self.first_token_s: float | None = None
        self.on_cancel: Callable[[], None] | None = None  # set by the scheduler while the request waits

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def cancel(self) -> None:
        """Ask the engine to end this request (any thread); a waiting request leaves the queue at once."""
        self._cancelled.set()
        hook = self.on_cancel
        if hook is not None:
            hook()

    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the last output was delivered; False on timeout."""
        return self._done.wait(timeout_s)

    def deliver(self, output: RequestOutput) -> None:
        """Engine side: hand ``output`` to the client (never raises)."""
        if self._done.is_set():
            return
        try:
            self._sink(output)
        except Exception:  # a client that went away must not stop the engine
            pass
        if output.finished:
            self._done.set()
