"""RemoteHandle: the API process's record of one request submitted to the engine process."""

from __future__ import annotations

import threading
from collections.abc import Callable

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink
from stagewise.engine.request_output import RequestOutput
from stagewise.errors import StagewiseError


class RemoteHandle:
    """Outputs arrive through :meth:`deliver` (the receiving thread); :meth:`cancel` asks the engine process
    to end the request. ``key`` names it on the wire (unique here; client request ids may repeat)."""

    def __init__(self, key: int, request: EngineRequest, sink: OutputSink, send_cancel: Callable[[int], None],
                 client_fd: int | None = None) -> None:
        self.key, self.request = key, request
        self._sink, self._send_cancel = sink, send_cancel
        self.client_fd = client_fd  # the HTTP client's socket, asked after each output (None: not asked)
        self._done = threading.Event()
        self._cancelled = False
        self.completion_tokens = 0  # as the last output said

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Ask once (the client's hang-up may be seen by the receiver and by the event loop)."""
        if not self.done and not self._cancelled:
            self._cancelled = True
            self._send_cancel(self.key)

    def deliver(self, output: RequestOutput) -> None:
        if self.done:
            return
        self.completion_tokens = output.completion_tokens
        if output.finished:
            self._done.set()
        self._sink(output)

    def fail(self, error: StagewiseError) -> None:
        """End the request with ``error`` (the engine process died under it)."""
        self.deliver(RequestOutput("", self.request.prompt_tokens, self.completion_tokens, finish_reason="error",
                                   error=error))
