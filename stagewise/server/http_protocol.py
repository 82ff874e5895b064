"""HeaderTimeoutProtocol: uvicorn's h11 protocol with a deadline on request headers.

uvicorn times out only an idle keep-alive connection *after* a response (``timeout_keep_alive``);
a socket that connects and sends nothing, or half a request line, is held forever (a thousand such
sockets hold a thousand file descriptors). Here every connection must deliver a request's complete
headers within ``header_timeout_s`` of connecting, and of its previous response; else it is closed.

Each request's scope records the connection's transport (:mod:`stagewise.server.client_socket`), so the
engine outputs' receiver can see a client gone without waiting for this event loop, and a stream stops
writing to a transport that is closing.

The body's deadline is the app's (``read_json``: 408 past ``--body-timeout-s``); a response that ends
before its request's body did (that 408, a 413, a route that reads no body) ends the connection, so a
client trickling a body it will never finish is not held either: the server half-closes (FIN after
the response), discards what still arrives, and closes when the client does or when uvicorn's
keep-alive timer (``--keep-alive-s``) fires. Closing at once with the client's bytes unread would
reset the connection (RST), and the client could lose the response.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from stagewise.server.client_socket import remember_client


class HeaderTimeoutProtocol(H11Protocol):
    """:class:`H11Protocol` plus a header deadline (``header_timeout_s``, set by :func:`protocol_class`)."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._discarding = False  # answered before the body was all in: what still arrives is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return  # NOTE: uvicorn's data_received is skipped, so its keep-alive timer stays armed: it ends the linger
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not None and self.cycle is not cycle:  # a request began: its app task has not run yet
            remember_client(cast(dict[str, Any], self.cycle.scope), self.transport)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in: the app has it
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:  # answered before the body was all in: not kept alive
            self._discarding = True
            try:
                self.transport.write_eof()  # FIN once the response is flushed; reading goes on, into nothing
            except OSError as exc:  # the client is gone already (ENOTCONN after its 413): nothing to half-close
                peer = f"{self.client[0]}:{self.client[1]} - " if self.client else ""
                self.logger.info("%sclient closed the connection before its response's end (%s)", peer,
                                 exc.strerror or exc)
                self.transport.close()
        else:
            self._arm()  # the next request's headers get the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_class(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """A :class:`HeaderTimeoutProtocol` subclass with ``header_timeout_s`` (uvicorn takes a class)."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s})
