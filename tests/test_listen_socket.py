"""listen_socket: the sockets it accepts get TCP_NODELAY from asyncio (small responses are not held back)."""

from __future__ import annotations

import asyncio
import socket

from stagewise.hardware.listen_socket import listen_socket


def test_accepted_connections_have_nodelay() -> None:
    async def accept_one() -> int:
        sock = listen_socket("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted = transport.get_extra_info("socket")
                seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
        return nodelay

    assert asyncio.run(accept_one()) != 0
