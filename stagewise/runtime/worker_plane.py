"""WorkerPlane: a worker's end of the control plane, a ZeroMQ DEALER to the coordinator's ROUTER.

The worker learns the plane's port once, from the rendezvous store (:func:`plane_port`: a signed
:class:`PlaneAddress`), connects a DEALER with routing id ``{rank}:{incarnation}``, and from then on
receives its assignment and commands and sends its join report and acknowledgements on it; a
receive blocks until a message comes. Every message is sealed and opened by :class:`MessageSeal`.

A heartbeat thread owns a second DEALER: it sends a :class:`Heartbeat` every :data:`HEARTBEAT_S`
(the coordinator's liveness signal for this worker) and watches that connection: when it drops (the
coordinator exited, or stopped answering ZeroMQ's own pings within the timeout) the process exits
(after :data:`EXIT_GRACE_S`, unless it is :attr:`WorkerPlane.leaving` already: the coordinator's
exit command and its closing race), so no worker outlives its coordinator.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import timedelta

import torch.distributed as dist
import zmq
from zmq.utils.monitor import recv_monitor_message

from stagewise.errors import WorkerMessageRejected, WorkerNotJoined
from stagewise.runtime.coordinator_plane import routing_id, zmq_endpoint
from stagewise.runtime.message_seal import MAX_MESSAGE_BYTES, MessageSeal
from stagewise.runtime.worker_messages import Down, Heartbeat, PlaneAddress, Up

HEARTBEAT_S = 1.0
EXIT_GRACE_S = 2.0  # after the connection drops, how long a worker may take to read an exit already sent
PLANE_KEY = "plane"  # the store key of the coordinator's signed PlaneAddress
SESSION_KEY = "session"  # the pool's nonce (hex), written raw by the coordinator once


def plane_port(store: dist.Store, secret: bytes, session: str, timeout_s: float) -> int:
    """The control plane's port, as the coordinator signed it into ``store``; :class:`WorkerNotJoined`
    when it is missing or not genuine."""
    try:
        store.wait([PLANE_KEY], timedelta(seconds=timeout_s))
        blob = bytes(store.get(PLANE_KEY))
        address: PlaneAddress = MessageSeal(secret, session, PlaneAddress, "worker").open(blob)
    except dist.DistStoreError:
        raise WorkerNotJoined(f"the coordinator published no control plane within {timeout_s:g} s") from None
    except WorkerMessageRejected as exc:
        raise WorkerNotJoined(f"the coordinator's control-plane address is not genuine ({exc})") from None
    return address.port


class WorkerPlane:
    """Connected to ``host:port`` as worker ``rank`` incarnation ``incarnation``."""

    def __init__(self, host: str, port: int, secret: bytes, session: str, rank: int, incarnation: str) -> None:
        self._endpoint = zmq_endpoint(host, port)
        self._secret, self._session = secret, session
        self.rank, self.incarnation = rank, incarnation
        who = f"worker {rank}"
        self._down: MessageSeal[Down] = MessageSeal(secret, session, Down, who)
        self._up: MessageSeal[Up] = MessageSeal(secret, session, Up, who)
        self._ctx = zmq.Context()
        self._sock = self._dealer(routing_id(rank, incarnation))
        self.leaving = threading.Event()  # set once the worker leaves on its own (its exit code stands)

    def _dealer(self, identity: bytes) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, identity)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + 64)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.setsockopt(zmq.IPV6, int(self._endpoint.startswith("tcp://[")))
        sock.connect(self._endpoint)
        return sock

    def send(self, message: Up) -> None:
        self._sock.send(self._up.seal(message))

    def receive(self) -> Down:
        """The next message from the coordinator (blocks); :class:`WorkerMessageRejected` (logged) for
        one that is unsigned, forged or malformed: the caller applies nothing and reads on."""
        return self._down.open(self._sock.recv())

    def ready(self) -> bool:
        """Whether a message from the coordinator is waiting (:meth:`receive` would not block)."""
        return bool(self._sock.poll(0, zmq.POLLIN))

    def start_heartbeat(self, timeout_s: float) -> None:
        """Beat on a connection of its own; exit the process when the coordinator is gone (or never
        answers within ``timeout_s``)."""
        sock = self._dealer(routing_id(self.rank, self.incarnation) + b":beat")
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_S * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(timeout_s * 1000))
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        threading.Thread(target=self._beat, args=(sock, monitor, timeout_s), name="stagewise-heartbeat",
                         daemon=True).start()

    def _beat(self, sock: zmq.Socket[bytes], monitor: zmq.Socket[bytes], timeout_s: float) -> None:
        connected, n, started = False, 0, time.monotonic()
        seal: MessageSeal[Up] = MessageSeal(self._secret, self._session, Up, f"worker {self.rank}")  # this thread's
        try:
            while True:
                n += 1
                try:
                    sock.send(seal.seal(Heartbeat(rank=self.rank, incarnation=self.incarnation, n=n)), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # not connected yet
                deadline = time.monotonic() + HEARTBEAT_S
                while (left := deadline - time.monotonic()) > 0:
                    if monitor.poll(int(left * 1000) + 1):
                        event = recv_monitor_message(monitor)["event"]
                        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                            connected = True
                        elif event == zmq.EVENT_DISCONNECTED and connected:
                            if self.leaving.wait(EXIT_GRACE_S):
                                return
                            os._exit(4)  # the coordinator is gone: leave no orphan behind
                if not connected and time.monotonic() - started > timeout_s:
                    os._exit(4)  # never reached it
        except BaseException:
            os._exit(4)

    def close(self) -> None:
        self._sock.close()
