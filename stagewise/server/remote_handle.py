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

    def __init__(self, key: int, request: EngineRequest, sink: OutputSink, send_cancel: Callable[[int], None]) -> None:
        self.key, self.request = key, request
        self._sink, self._send_cancel = sink, send_cancel
        self._done = threading.Event()
        self.completion_tokens = 0  # as the last output said

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        if not self.done:
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
