"""CoordinatorPlane: the coordinator's end of the control plane, one ZeroMQ ROUTER socket.

Every worker incarnation connects a DEALER (routing id ``{rank}:{incarnation}``) and a second one for
its heartbeats; its join report arrives on the first, so the ROUTER can route to it from then on. One
I/O thread owns the socket: it files what arrives (join reports, acknowledgements, heartbeats, link
figures) under one condition variable and sends what other threads queue (:meth:`send`: seal in the
caller, hand over through an ``inproc`` wake-up socket). Nothing polls with sleeps: the I/O thread
blocks on both sockets, waiters block on the condition.

Every message is sealed and opened by :class:`MessageSeal`; a genuine message that is not expected
(from another connection than its worker incarnation's, an acknowledgement of a command nobody
awaits or one already counted, a heartbeat not newer than the last, link figures of a probe not
running) is a replay, logged and dropped like a forged one.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable

import msgspec
import zmq

from stagewise.errors import WorkerMessageRejected
from stagewise.runtime.link_probe import ProbeReport
from stagewise.runtime.message_seal import MAX_MESSAGE_BYTES, MessageSeal, stderr_log
from stagewise.runtime.worker_messages import Ack, Heartbeat, JoinReport, ProbeDone, Up

LINGER_MS = 2000  # on close, how long queued messages (the workers' exit) may still go out


def routing_id(rank: int, incarnation: str) -> bytes:
    return f"{rank}:{incarnation}".encode()


def zmq_endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class CoordinatorPlane:
    """Binds a ROUTER on ``host`` (a free port: :attr:`port`) for the workers of one session."""

    def __init__(self, host: str, secret: bytes, session: str, log: Callable[[str], None] = stderr_log) -> None:
        self._seal: MessageSeal[Up] = MessageSeal(secret, session, Up, "coordinator", log)
        self._log = log
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable message raises (dropped, not queued)
        self._router.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES + 64)
        self._router.setsockopt(zmq.LINGER, LINGER_MS)
        self._router.setsockopt(zmq.IPV6, int(":" in host))
        self._router.bind(zmq_endpoint(host, "*"))
        self.port = int(self._router.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self._wake_in = self._ctx.socket(zmq.PULL)
        self._wake_in.bind(f"inproc://wake-{id(self)}")
        self._wake_out = self._ctx.socket(zmq.PUSH)
        self._wake_out.connect(f"inproc://wake-{id(self)}")
        self._outbox: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.joins: dict[int, JoinReport] = {}  # rank -> its latest join report
        self._acks: dict[int, dict[int, Ack]] = {}  # awaited command -> rank -> acknowledgement
        self._awaited: dict[int, dict[int, str]] = {}  # awaited command -> rank -> incarnation
        self._beats: dict[str, tuple[int, float]] = {}  # incarnation -> (last n, when it came)
        self._probes: dict[int, dict[int, ProbeReport]] = {}  # running probe n -> rank -> report
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="stagewise-plane", daemon=True)
        self._thread.start()

    # ----- sending (any thread) ------------------------------------------------------------------

    def send(self, to: Iterable[tuple[int, str]], message: msgspec.Struct) -> None:
        """Queue ``message`` (sealed once) for each ``(rank, incarnation)``; the I/O thread sends it.
        A worker that is gone never receives it (its death is found by its heartbeat)."""
        blob = self._seal.seal(message)
        with self._send_lock:
            if self._closed:
                return
            self._outbox.extend((routing_id(rank, inc), blob) for rank, inc in to)
            self._wake_out.send(b"", zmq.NOBLOCK)

    # ----- what arrived (any thread) --------------------------------------------------------------

    def expect(self, seq: int, members: dict[int, str]) -> None:
        """Count acknowledgements of command ``seq`` from these incarnations (before sending it)."""
        with self.cond:
            self._awaited[seq] = dict(members)
            self._acks[seq] = {}

    def acks(self, seq: int) -> dict[int, Ack]:
        with self.cond:
            return dict(self._acks.get(seq, {}))

    def forget(self, seq: int) -> dict[int, Ack]:
        """Stop awaiting command ``seq``; returns what arrived (later answers count as replays)."""
        with self.cond:
            self._awaited.pop(seq, None)
            return self._acks.pop(seq, {})

    def awaiting(self) -> list[int]:
        """The commands whose acknowledgements are still counted."""
        with self.cond:
            return sorted(self._awaited)

    def expect_probe(self, n: int) -> None:
        with self.cond:
            self._probes[n] = {}

    def probe_reports(self, n: int) -> dict[int, ProbeReport]:
        with self.cond:
            return dict(self._probes.get(n, {}))

    def last_beat(self, incarnation: str) -> float | None:
        """When (``time.monotonic``) ``incarnation``'s latest heartbeat arrived; None before its first."""
        with self.cond:
            beat = self._beats.get(incarnation)
        return None if beat is None else beat[1]

    def wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Block until ``ready()`` (checked under the condition, after each arrival) or ``timeout_s``."""
        with self.cond:
            return self.cond.wait_for(ready, max(0.0, timeout_s))

    @property
    def rejected(self) -> int:
        """Messages refused so far (unsigned, forged, malformed, replayed)."""
        return self._seal.rejected

    def wake(self) -> None:
        """Make every waiter check again (a watcher found a worker dead)."""
        with self.cond:
            self.cond.notify_all()

    # ----- the I/O thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self._closed:
            ready = dict(poller.poll())
            if self._wake_in in ready:
                while self._wake_in.poll(0):
                    self._wake_in.recv()
                self._flush()
            if self._router in ready:
                while self._router.poll(0):
                    frames = self._router.recv_multipart()
                    try:
                        self._file(frames[0], self._seal.open(frames[-1]))
                    except WorkerMessageRejected:
                        self.wake()  # logged and counted by the seal (:attr:`rejected`)
                    except Exception as exc:  # NOTE: this thread must outlive a bug in filing one message
                        self._log(f"stagewise coordinator: control plane: {type(exc).__name__}: {exc}")
        self._flush()  # what was queued before close (the workers' exit)

    def _flush(self) -> None:
        while self._outbox:
            identity, blob = self._outbox.popleft()
            try:
                self._router.send_multipart([identity, blob], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # unroutable (the worker is gone) or its queue is full (hung): its heartbeat tells

    def _file(self, sender: bytes, message: Up) -> None:
        """File ``message`` from the connection ``sender`` (its routing id); a message that names another
        worker incarnation than its connection's is refused like a replay."""
        rank, incarnation = (message.report.rank, message.incarnation) if isinstance(message, ProbeDone) else \
            (message.rank, message.incarnation)
        own = routing_id(rank, incarnation) + (b":beat" if isinstance(message, Heartbeat) else b"")
        if sender != own:
            self._seal.reject(msgspec.msgpack.encode(message), f"a message of worker {rank} from another connection")
        with self.cond:
            if isinstance(message, JoinReport):
                self.joins[message.rank] = message
            elif isinstance(message, Ack):
                awaited = self._awaited.get(message.seq, {})
                if awaited.get(message.rank) != message.incarnation or message.rank in self._acks[message.seq]:
                    self._seal.reject(msgspec.msgpack.encode(message), f"acknowledgement of command {message.seq} by "
                                      f"worker {message.rank} not awaited (a replay or too late)")
                self._acks[message.seq][message.rank] = message
            elif isinstance(message, Heartbeat):
                last = self._beats.get(message.incarnation, (-1, 0.0))[0]
                if message.n <= last:
                    self._seal.reject(msgspec.msgpack.encode(message), f"heartbeat {message.n} of worker "
                                      f"{message.rank} replayed (last {last})")
                self._beats[message.incarnation] = (message.n, time.monotonic())
            elif isinstance(message, ProbeDone):
                if message.n not in self._probes or message.report.rank in self._probes[message.n]:
                    self._seal.reject(msgspec.msgpack.encode(message), f"link figures of probe {message.n} not awaited")
                self._probes[message.n][message.report.rank] = message.report
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the I/O thread (queued messages still go out for :data:`LINGER_MS`) and the sockets."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self._wake_out.send(b"", zmq.NOBLOCK)
        self._thread.join(timeout=5)
        for sock in (self._wake_out, self._wake_in, self._router):
            sock.close()
        self._ctx.term()
