"""CoordinatorPlane: the coordinator's end of the control plane, one ZeroMQ ROUTER socket.

Every worker incarnation connects a DEALER (routing id ``{rank}:{incarnation}``) and a second one for
its heartbeats; its join report arrives on the first, so the ROUTER can route to it from then on.

No thread hands a step's messages to another: :meth:`send` sends from the caller's thread, and a
thread blocked in :meth:`wait` reads the socket itself when something arrives, so a command and its
acknowledgements cost the stepping thread no wake-up of another thread (two of them, ~150 µs a step
on the 2-core machine, when one I/O thread owned the socket). The socket is used by one thread at a
time (a lock): a ZeroMQ socket is not thread-safe, and is safe under a lock. Waiting threads and the
I/O thread sleep in ``poll(2)`` on the socket's notification descriptor (``ZMQ_FD``): it is
edge-triggered (an operation on the socket may consume the signal of what arrived meanwhile), so
whoever holds the lock reads everything readable before letting go. The I/O thread reads what
arrives while nobody waits (heartbeats between steps, join reports). Filing a message, or
:meth:`wake`, wakes every waiter (a pipe per waiting thread) to look at its condition again. Nothing
polls with sleeps.

Every message is sealed and opened by :class:`MessageSeal`; a genuine message that is not expected
(from another connection than its worker incarnation's, an acknowledgement of a command nobody
awaits or one already counted, a heartbeat not newer than the last, link figures of a probe not
running) is a replay, logged and dropped like a forged one.
"""

from __future__ import annotations

import os
import select
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
        self._fd = int(self._router.getsockopt(zmq.FD))  # readable when the socket's events may have changed
        self._sock_lock = threading.Lock()  # one thread at a time uses the socket
        self._io_wake_r, self._io_wake_w = _pipe()  # wakes the I/O thread to leave (close)
        self._waiters: set[int] = set()  # the wake pipes (write ends) of the threads in wait()
        self._io_watching = True  # the I/O thread polls the socket (no thread waited when it last looked)
        self._local = threading.local()  # each waiting thread's wake pipe
        self.lock = threading.RLock()  # guards what was filed (below); re-entered by wait()'s ready()
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
        """Send ``message`` (sealed once) to each ``(rank, incarnation)`` from this thread. A worker that
        is gone never receives it (its death is found by its heartbeat)."""
        blob = self._seal.seal(message)
        with self._sock_lock:
            if self._closed:
                return
            for rank, inc in to:
                try:
                    self._router.send_multipart([routing_id(rank, inc), blob], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass  # unroutable (the worker is gone) or its queue is full (hung): its heartbeat tells
            self._read()  # sending may have taken the signal of what arrived meanwhile

    # ----- what arrived (any thread) --------------------------------------------------------------

    def expect(self, seq: int, members: dict[int, str]) -> None:
        """Count acknowledgements of command ``seq`` from these incarnations (before sending it)."""
        with self.lock:
            self._awaited[seq] = dict(members)
            self._acks[seq] = {}

    def acks(self, seq: int) -> dict[int, Ack]:
        with self.lock:
            return dict(self._acks.get(seq, {}))

    def forget(self, seq: int) -> dict[int, Ack]:
        """Stop awaiting command ``seq``; returns what arrived (later answers count as replays)."""
        with self.lock:
            self._awaited.pop(seq, None)
            return self._acks.pop(seq, {})

    def awaiting(self) -> list[int]:
        """The commands whose acknowledgements are still counted."""
        with self.lock:
            return sorted(self._awaited)

    def expect_probe(self, n: int) -> None:
        with self.lock:
            self._probes[n] = {}

    def probe_reports(self, n: int) -> dict[int, ProbeReport]:
        with self.lock:
            return dict(self._probes.get(n, {}))

    def last_beat(self, incarnation: str) -> float | None:
        """When (``time.monotonic``) ``incarnation``'s latest heartbeat arrived; None before its first."""
        with self.lock:
            beat = self._beats.get(incarnation)
        return None if beat is None else beat[1]

    def wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Block until ``ready()`` (checked under the lock, after each arrival) or ``timeout_s``;
        meanwhile this thread reads the socket itself whenever something arrives."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        wake_r, wake_w = self._wake_pipe()
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        with self.lock:
            self._waiters.add(wake_w)
        try:
            while True:
                with self.lock:
                    if ready():
                        return True
                left_s = deadline - time.monotonic()
                if left_s <= 0 or self._closed:
                    return False
                poller.poll(left_s * 1000 + 1)
                _drain(wake_r)
                self._pump()
        finally:
            with self.lock:
                self._waiters.discard(wake_w)
                if not self._waiters and not self._io_watching:
                    os.write(self._io_wake_w, b"x")  # the I/O thread reads again

    @property
    def rejected(self) -> int:
        """Messages refused so far (unsigned, forged, malformed, replayed)."""
        return self._seal.rejected

    def wake(self) -> None:
        """Make every waiter check again (a watcher found a worker dead)."""
        with self.lock:
            self._notify()

    # ----- reading (any thread) -------------------------------------------------------------------

    def _wake_pipe(self) -> tuple[int, int]:
        pipe: _WakePipe | None = getattr(self._local, "pipe", None)
        if pipe is None:
            pipe = self._local.pipe = _WakePipe()
        return pipe.r, pipe.w

    def _notify(self) -> None:
        """Wake every waiting thread (the caller holds the lock)."""
        for fd in self._waiters:
            try:
                os.write(fd, b"x")
            except BlockingIOError:
                pass  # its pipe is full: it is awake already

    def _read(self) -> None:
        """Open and file everything readable now, in the order it arrived (the caller holds the socket
        lock: two threads filing what they read at once could file a worker's messages out of order)."""
        while not self._closed and int(self._router.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            frames = self._router.recv_multipart(zmq.NOBLOCK)
            try:
                self._file(frames[0], self._seal.open(frames[-1]))
            except WorkerMessageRejected:
                self.wake()  # logged and counted by the seal (:attr:`rejected`)
            except Exception as exc:  # NOTE: a bug in filing one message must not stop the reading
                self._log(f"stagewise coordinator: control plane: {type(exc).__name__}: {exc}")

    def _pump(self) -> None:
        with self._sock_lock:
            self._read()

    def _serve(self) -> None:
        """The I/O thread: reads what arrives while no thread waits (heartbeats between steps, joins);
        while one does, that one reads, and this thread sleeps until the last waiter leaves."""
        watching, idle = select.poll(), select.poll()
        for poller in (watching, idle):
            poller.register(self._io_wake_r, select.POLLIN)
        watching.register(self._fd, select.POLLIN)
        while not self._closed:
            with self.lock:
                self._io_watching = not self._waiters
            (watching if self._io_watching else idle).poll()
            _drain(self._io_wake_r)
            with self.lock:
                if self._waiters:
                    continue
            self._pump()

    def _file(self, sender: bytes, message: Up) -> None:
        """File ``message`` from the connection ``sender`` (its routing id); a message that names another
        worker incarnation than its connection's is refused like a replay."""
        rank, incarnation = (message.report.rank, message.incarnation) if isinstance(message, ProbeDone) else \
            (message.rank, message.incarnation)
        own = routing_id(rank, incarnation) + (b":beat" if isinstance(message, Heartbeat) else b"")
        if sender != own:
            self._seal.reject(msgspec.msgpack.encode(message), f"a message of worker {rank} from another connection")
        with self.lock:
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
            self._notify()

    def close(self) -> None:
        """Stop the I/O thread and close the socket (what was sent may still go out for :data:`LINGER_MS`)."""
        with self._sock_lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._io_wake_w, b"x")
        self.wake()
        self._thread.join(timeout=5)
        with self._sock_lock:
            self._router.close()
        self._ctx.term()
        os.close(self._io_wake_r)
        os.close(self._io_wake_w)


class _WakePipe:
    """A waiting thread's wake-up pipe, closed with the thread's local storage."""

    def __init__(self) -> None:
        self.r, self.w = _pipe()

    def __del__(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
