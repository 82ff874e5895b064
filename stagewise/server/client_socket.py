"""The HTTP client's socket, asked whether the client hung up without waiting for the event loop.

A streaming client that goes away is noticed by the event loop (uvicorn's ``connection_lost``, then the
response's disconnect watcher), and on a machine short of cores the event loop is the thread that waits
longest: the engine meanwhile runs tokens for nobody. The engine outputs' receiver therefore asks the
sockets of the requests it just delivered to, with one ``poll(2)`` per engine step, and cancels those
whose client hung up (or reset) at once.

The file descriptor is read when the request's headers arrive (:func:`remember_client_fd`, from the
HTTP protocol) and may be closed and reused once the connection ends. That is safe for this question:
a descriptor can be reused only after its connection closed, so whatever the number reports later, the
request's own client is gone already or the answer is "still there" (a fresh connection's state), and
the event loop's watcher still ends the request as before.
"""

from __future__ import annotations

import select
from collections.abc import Iterable, MutableMapping
from typing import Any

_SCOPE_KEY = "stagewise.client_fd"  # in the ASGI scope's "extensions"
_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)


def remember_client_fd(scope: MutableMapping[str, Any], fd: int) -> None:
    """Record the connection's descriptor in a request's ASGI scope (before the app sees the scope)."""
    scope.setdefault("extensions", {})[_SCOPE_KEY] = fd


def client_fd(scope: MutableMapping[str, Any]) -> int | None:
    """The descriptor :func:`remember_client_fd` recorded; None for a scope without a socket (a test client)."""
    fd = scope.get("extensions", {}).get(_SCOPE_KEY)
    return fd if isinstance(fd, int) and fd >= 0 else None


def hung_up(fds: Iterable[int]) -> set[int]:
    """Which of ``fds`` report that their peer hung up, reset or is closed (one ``poll``, no waiting)."""
    poller = select.poll()
    for fd in set(fds):
        poller.register(fd, getattr(select, "POLLRDHUP", 0))  # POLLHUP, POLLERR and POLLNVAL always count
    return {fd for fd, events in poller.poll(0) if events & _GONE}
