"""The HTTP client's socket, asked whether the client hung up without waiting for the event loop.

A streaming client that goes away is noticed by the event loop (uvicorn's ``connection_lost``, then the
response's disconnect watcher), and on a machine short of cores the event loop is the thread that waits
longest: the engine meanwhile runs tokens for nobody. The engine outputs' receiver therefore asks the
sockets of the requests it just delivered to, with one ``poll(2)`` per engine step, and cancels those
whose client hung up (or reset) at once.

The connection's transport is recorded in the request's scope when its headers arrive
(:func:`remember_client`, from the HTTP protocol); the descriptor read from it at submission may be
closed and reused once the connection ends. That is safe for this question:
a descriptor can be reused only after its connection closed, so whatever the number reports later, the
request's own client is gone already or the answer is "still there" (a fresh connection's state), and
the event loop's watcher still ends the request as before.

On the event loop, a stream stops writing once its transport is closing (:func:`client_transport`):
a send that failed (the client reset the connection) closes the transport at once but tells the
response only an iteration later, and every write meanwhile logs asyncio's "socket.send() raised
exception." warning.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Iterable, MutableMapping
from typing import Any

_SCOPE_KEY = "stagewise.client_transport"  # in the ASGI scope's "extensions"
_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


def remember_client(scope: MutableMapping[str, Any], transport: asyncio.BaseTransport) -> None:
    """Record the connection's transport in a request's ASGI scope (before the app sees the scope)."""
    scope.setdefault("extensions", {})[_SCOPE_KEY] = transport


def client_transport(scope: MutableMapping[str, Any]) -> asyncio.BaseTransport | None:
    """The transport :func:`remember_client` recorded; None for a scope without one (a test client)."""
    transport = scope.get("extensions", {}).get(_SCOPE_KEY)
    return transport if isinstance(transport, asyncio.BaseTransport) else None


def client_fd(transport: asyncio.BaseTransport | None) -> int | None:
    """The descriptor of ``transport``'s socket; None without one, or once it is closed."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    fd = sock.fileno() if sock is not None else -1
    return fd if fd >= 0 else None


def hung_up(fds: Iterable[int]) -> set[int]:
    """Which of ``fds`` report that their peer hung up, reset or is closed (one ``poll``, no waiting)."""
    poller = select.poll()
    for fd in set(fds):
        poller.register(fd, getattr(select, "POLLRDHUP", 0))  # POLLHUP, POLLERR and POLLNVAL always count
    return {fd for fd, events in poller.poll(0) if events & _GONE}
