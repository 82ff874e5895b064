"""What the response handlers share about engine outputs: failures, client disconnects, SSE headers."""

from __future__ import annotations

from starlette.requests import Request

from stagewise.engine.request_output import RequestOutput
from stagewise.engine.scheduler import EngineClosed
from stagewise.errors import StagewiseError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The HTTP client disconnected before the response was complete."""


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
