"""Choices: a watched client's disconnect cancels its engine requests at once, however full the queue."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from starlette.requests import Request

from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.request_output import RequestOutput
from stagewise.server.choices import Choices
from stagewise.server.output_stream import ClientGone


class _Handle:
    """What Choices asks of a RequestHandle."""

    request_id = "chatcmpl-test"

    def __init__(self) -> None:
        self.done = False
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _request(disconnected: asyncio.Event) -> Request:
    async def receive() -> dict[str, Any]:
        await disconnected.wait()
        return {"type": "http.disconnect"}
    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_a_disconnect_cancels_a_stream_whose_outputs_are_always_queued() -> None:
    async def run() -> tuple[bool, int]:
        choices = Choices()
        handle = _Handle()
        choices.handles.append(cast(RequestHandle, handle))
        disconnected = asyncio.Event()
        choices.watch(_request(disconnected))
        token = RequestOutput("x", 3, 1)
        for _ in range(3):
            choices.queue.put_nowait((0, token))
        read = 0
        with pytest.raises(ClientGone):
            while True:
                await choices.get()
                read += 1
                choices.queue.put_nowait((0, token))  # the engine is always one output ahead
                if read == 2:
                    disconnected.set()
                    await asyncio.sleep(0)  # the watcher's turn: it runs when the stream yields once
        choices.cancel()
        return handle.cancelled, read
    cancelled, read = asyncio.run(run())
    assert cancelled  # by the watcher, not by the stream's end
    assert read < 10  # the outputs queued before the disconnect, then ClientGone


def test_get_without_a_watcher_reads_the_queue() -> None:
    async def run() -> tuple[int, RequestOutput]:
        choices = Choices()
        choices.queue.put_nowait((0, RequestOutput("a", 1, 1, finish_reason="stop")))
        return await choices.get()
    index, output = asyncio.run(run())
    assert index == 0 and output.text == "a"
