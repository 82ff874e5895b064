"""OutputStream: carries a request's outputs from the engine thread to an asyncio handler."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.scheduler import EngineClosed
from stagewise.errors import StagewiseError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client disconnected before the response was complete."""


class OutputStream:
    """An asyncio queue the engine feeds through :meth:`put` (thread-safe)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

    def put(self, output: RequestOutput) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, output)

    async def get(self) -> RequestOutput:
        return await self.queue.get()


def failure(output: RequestOutput) -> StagewiseError:
    """The typed error of an output that did not finish normally (an error, or a cancellation)."""
    if output.error is not None:
        return output.error
    return EngineClosed("the request was cancelled because the server is shutting down")


def failed(output: RequestOutput) -> bool:
    return output.finish_reason in ("error", "cancelled")


async def wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (the body must have been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(handle: RequestHandle, stream: OutputStream, request: Request) -> list[RequestOutput]:
    """Every output up to the finished one. Cancels the request and raises :class:`ClientGone`
    if the client disconnects first; raises the request's typed error if it did not finish normally."""
    watcher = asyncio.ensure_future(wait_disconnect(request))
    outputs: list[RequestOutput] = []
    try:
        while True:
            getter = asyncio.ensure_future(stream.get())
            done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                raise ClientGone(handle.request_id)
            output = getter.result()
            outputs.append(output)
            if failed(output):
                raise failure(output)
            if output.finished:
                return outputs
    finally:
        watcher.cancel()
        if not handle.done:
            handle.cancel()
