"""HeaderTimeoutProtocol: a client gone before the half-close of its early answer is one log line, no traceback."""

from __future__ import annotations

import asyncio
import errno
import logging
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from stagewise.server.http_protocol import protocol_class


class GoneTransport(asyncio.Transport):
    """A socket whose peer has reset: writes vanish, the half-close fails with ENOTCONN."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = asyncio.Event()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("10.0.0.7", 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def write_eof(self) -> None:
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def close(self) -> None:
        self.closed.set()

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


async def _answer_413(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers before reading the body, as the guards do for a Content-Length over the limit."""
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def test_a_client_gone_after_its_413_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> GoneTransport:
        config = Config(app=_answer_413, log_config=None)
        protocol = protocol_class(10.0)(config=config, server_state=ServerState(), app_state={})
        transport = GoneTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n{")
        await asyncio.wait_for(transport.closed.wait(), 30)  # a bound on a hang
        protocol.connection_lost(None)
        return transport

    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        transport = asyncio.run(main())
    assert transport.written.startswith(b"HTTP/1.1 413 ")
    lines = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert lines[0].getMessage() == ("10.0.0.7:40000 - client closed the connection before its response's end "
                                     "(Transport endpoint is not connected)")
