"""Choices: the ``n`` engine requests of one HTTP request, submitted together, outputs merged.

Each choice is its own engine request (own sampler and seed); their outputs reach the asyncio
handler through one queue as ``(choice index, output)`` in the order the engine produced them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.requests import Request

from stagewise.engine.engine import Engine
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink, RequestHandle
from stagewise.engine.request_output import RequestOutput
from stagewise.server.output_stream import ClientGone, failed, failure, wait_disconnect


class Choices:
    """Handles of one HTTP request's engine requests (index = choice index) and their merged outputs."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        self.handles: list[RequestHandle] = []

    @classmethod
    def submit(cls, engine: Engine, requests: Sequence[EngineRequest]) -> Choices:
        """Submit every request; if one is refused (``QueueFull``, ...), cancel those already queued and raise."""
        choices = cls()
        try:
            for index, request in enumerate(requests):
                choices.handles.append(engine.submit(request, choices._sink(index)))
        except BaseException:
            choices.cancel()
            raise
        return choices

    def _sink(self, index: int) -> OutputSink:
        def put(output: RequestOutput) -> None:  # engine thread
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, output))
        return put

    @property
    def n(self) -> int:
        return len(self.handles)

    @property
    def request_id(self) -> str:
        return self.handles[0].request_id

    async def get(self) -> tuple[int, RequestOutput]:
        """The next output of any choice, with its index."""
        return await self.queue.get()

    def cancel(self) -> None:
        """Cancel every choice not finished yet."""
        for handle in self.handles:
            if not handle.done:
                handle.cancel()

    async def collect(self, request: Request) -> list[list[RequestOutput]]:
        """Every output of every choice, up to each one's finished output. Cancels them all and raises
        :class:`ClientGone` if the client disconnects first, or the typed error of a choice that failed."""
        watcher = asyncio.ensure_future(wait_disconnect(request))
        outputs: list[list[RequestOutput]] = [[] for _ in self.handles]
        finished = 0
        try:
            while finished < self.n:
                getter = asyncio.ensure_future(self.get())
                done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    raise ClientGone(self.request_id)
                index, output = getter.result()
                outputs[index].append(output)
                if failed(output):
                    raise failure(output)
                finished += output.finished
            return outputs
        finally:
            watcher.cancel()
            self.cancel()
