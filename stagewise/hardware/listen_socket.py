"""listen_socket: a TCP socket listening on one address only (the server's port, the worker store)."""

from __future__ import annotations

import socket


def listen_socket(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A socket bound to ``host:port`` (IPv6 when ``host`` has a colon) and listening; raises
    :class:`OSError` when the address cannot be had, with nothing left open."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # NOTE: proto named, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto is
    # IPPROTO_TCP; without it Nagle and delayed ACKs held each keep-alive response ~40 ms
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
