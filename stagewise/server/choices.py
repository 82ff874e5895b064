"""Choices: the ``n`` engine requests of one HTTP request, submitted together, outputs merged.

Each choice is its own engine request (own sampler and seed); their outputs reach the asyncio
handler through one queue as ``(choice index, output)`` in the order the engine produced them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import StreamingResponse

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink
from stagewise.engine.request_output import RequestOutput
from stagewise.server.client_socket import client_fd
from stagewise.server.engine_front import EngineFront, Handle
from stagewise.server.output_stream import SSE_HEADERS, ClientGone, failed, failure, wait_disconnect


class Choices:
    """Handles of one HTTP request's engine requests (index = choice index) and their merged outputs."""

    def __init__(self, client: asyncio.BaseTransport | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.client = client  # the HTTP client's connection (None: a test client)
        self.queue: asyncio.Queue[tuple[int, RequestOutput] | None] = asyncio.Queue()  # None: the client is gone
        self.handles: list[Handle] = []
        self._watcher: asyncio.Task[None] | None = None
        self.first_output_s: float | None = None  # time.perf_counter() when the first output was taken

    @classmethod
    async def submit(cls, engine: EngineFront, requests: Sequence[EngineRequest],
                     client: asyncio.BaseTransport | None = None) -> Choices:
        """Submit every request (``client``: the HTTP connection, whose socket the engine front asks after
        each output, see :meth:`EngineFront.submit`); if one is refused (``QueueFull``, ...), cancel those
        already queued and raise."""
        choices = cls(client)
        fd = client_fd(client)
        try:
            for index, request in enumerate(requests):
                choices.handles.append(await engine.submit(request, choices._sink(index), fd))
        except BaseException:
            choices.cancel()
            raise
        return choices

    def _sink(self, index: int) -> OutputSink:
        def put(output: RequestOutput) -> None:  # the engine's thread, or the engine process's receiver
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, output))
        return put

    @property
    def n(self) -> int:
        return len(self.handles)

    @property
    def request_id(self) -> str:
        return self.handles[0].request_id

    def watch(self, request: Request) -> None:
        """Watch ``request``'s client (its body read already): once it disconnects, every choice is
        cancelled at once and :meth:`get` raises :class:`ClientGone` (after the outputs queued before).

        NOTE: the engine requests are cancelled by the watcher itself, not left to the response's
        cancellation, which reaches a stream only while it waits for an output: one whose outputs are
        always queued when it looks would otherwise run to its end for nobody."""
        async def watch_client() -> None:
            await wait_disconnect(request)
            self._cancel_handles()
            self.queue.put_nowait(None)
        self._watcher = asyncio.ensure_future(watch_client())

    async def get(self) -> tuple[int, RequestOutput]:
        """The next output of any choice, with its index; :class:`ClientGone` once the watched client
        (:meth:`watch`) has disconnected."""
        item = await self.queue.get()
        if item is None or (self.client is not None and self.client.is_closing()):
            raise ClientGone(self.request_id)  # nothing more is written to a closing connection
        if self.first_output_s is None:
            self.first_output_s = time.perf_counter()
        return item

    def cancel(self) -> None:
        """Cancel every choice not finished yet, and stop watching the client."""
        if self._watcher is not None:
            self._watcher.cancel()
        self._cancel_handles()

    def _cancel_handles(self) -> None:
        for handle in self.handles:
            if not handle.done:
                handle.cancel()

    def stream(self, request: Request, events: AsyncIterator[str],
               media_type: str = "text/event-stream") -> StreamingResponse:
        """The streamed response of ``events`` (made from these choices' outputs; server-sent events unless
        ``media_type`` says otherwise), the client watched (:meth:`watch`): a client gone ends the stream, and
        its engine requests, at its next output."""
        self.watch(request)
        return StreamingResponse(events, media_type=media_type, headers=SSE_HEADERS)

    async def collect(self, request: Request) -> list[list[RequestOutput]]:
        """Every output of every choice, up to each one's finished output. Cancels them all and raises
        :class:`ClientGone` if the client disconnects first, or the typed error of a choice that failed."""
        self.watch(request)
        outputs: list[list[RequestOutput]] = [[] for _ in self.handles]
        finished = 0
        try:
            while finished < self.n:
                index, output = await self.get()
                outputs[index].append(output)
                if failed(output):
                    raise failure(output)
                finished += output.finished
            return outputs
        finally:
            self.cancel()
