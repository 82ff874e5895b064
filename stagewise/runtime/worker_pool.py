"""WorkerPool: the coordinator's side of membership — the rendezvous store and the control plane
it hosts, the workers that joined, the local worker processes it spawned, and whether each worker is
still alive.

Liveness has three signals: a local worker's process exit (seen at once), a worker's heartbeats
that stop for ``heartbeat_timeout_s`` (a remote death, or a hung process), and a step that is not
acknowledged in time (judged by the pipeline).

The store (torch.distributed's rendezvous; it also carries the session nonce and the plane's signed
port) and the plane (:class:`CoordinatorPlane`) listen only where :class:`WorkerMode` says (127.0.0.1
for local workers). Every plane message is signed with the pool's secret (:class:`MessageSeal`): a
fresh one per pool for local workers (handed over in their environment), the shared one for remote
workers. Join reports that are unsigned, forged or a replay of an earlier incarnation are ignored.
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from stagewise.errors import ConfigError, WorkerNotJoined
from stagewise.hardware.listen_socket import listen_socket
from stagewise.runtime.coordinator_plane import CoordinatorPlane
from stagewise.runtime.distributed_group import WORKER_ENV
from stagewise.runtime.message_seal import MessageSeal
from stagewise.runtime.ray_workers import RayWorkers
from stagewise.runtime.worker_messages import JoinReport, PlaneAddress
from stagewise.runtime.worker_mode import WorkerMode
from stagewise.runtime.worker_plane import PLANE_KEY, SESSION_KEY
from stagewise.runtime.worker_secret import SECRET_ENV, new_secret

if TYPE_CHECKING:
    from stagewise.runtime.worker_segment import Opener

__all__ = ["WorkerMode", "WorkerPool", "local_worker_threads"]

PROCESS_CHECK_S = 0.1  # while waiting for joins, how often a local worker's exit is looked for


def local_worker_threads(workers: int) -> int:
    """CPU threads for each of ``workers`` local worker processes: this process's cores, shared."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, workers))


class WorkerPool:
    """Hosts the store (rank 0 of the rendezvous) and tracks workers ``1..count``.

    ``secret``: the shared secret of remote workers (required for them); local workers get a
    fresh one. ``log``: where rejected messages are reported (one line each)."""

    def __init__(self, mode: WorkerMode, timeout_s: float = 30.0, heartbeat_timeout_s: float = 10.0,
                 secret: bytes | None = None) -> None:
        if secret is None and not mode.spawned:
            raise ConfigError("remote workers need a shared secret (--worker-secret-file PATH or "
                              f"${SECRET_ENV})")
        self.mode = mode
        self.timeout_s = timeout_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.secret = secret if secret is not None else new_secret()
        self.session = secrets.token_hex(16)  # messages of another pool (an earlier serve) never verify
        try:
            sock = listen_socket(mode.host, mode.port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {mode.host}:{mode.port} for workers ({exc.strerror})") from None
        host, port = sock.getsockname()[:2]
        self.listen_address: tuple[str, int] = (str(host), int(port))  # as the kernel reports it
        self.port = int(port)
        try:
            raw = dist.TCPStore(mode.connect_host, self.port, None, True, timedelta(seconds=timeout_s),
                                wait_for_workers=False, master_listen_fd=sock.fileno())
        except Exception as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {mode.host}:{mode.port} for workers ({exc})") from None
        sock.detach()  # the store's server owns the descriptor now
        try:
            self.plane = CoordinatorPlane(mode.host, self.secret, self.session)
        except Exception as exc:
            raise ConfigError(f"cannot listen on {mode.host} for the workers' control plane ({exc})") from None
        self.store = raw  # torch.distributed's rendezvous (the data and probe groups)
        raw.set(SESSION_KEY, self.session)
        seal: MessageSeal[PlaneAddress] = MessageSeal(self.secret, self.session, PlaneAddress, "coordinator")
        raw.set(PLANE_KEY, seal.seal(PlaneAddress(port=self.plane.port)))  # type: ignore[arg-type]  # takes bytes too
        self.count = mode.count
        self.members: dict[int, JoinReport] = {}  # rank -> the incarnation in use
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._admitted: dict[int, float] = {}  # rank -> when its member was admitted
        self.probes = 0  # link probes sent (each numbered)
        self.ray: RayWorkers | None = None  # the actors of ``ray:N`` (:meth:`launch_ray`)
        self._seen: dict[int, set[str]] = {}  # rank -> incarnations admitted before (a replay is refused)
        self._closed = False
        atexit.register(_kill_at_exit, weakref.ref(self))

    @property
    def address(self) -> str:
        return f"{self.mode.connect_host}:{self.port}"

    # ----- local workers -------------------------------------------------------------------------

    def launch_ray(self, devices: str | None, opener: Opener) -> None:
        """Place the ``ray:N`` worker actors (each offers ``devices``, None: what it sees; each opens the
        model with ``opener``, a module-level function Ray sends by reference)."""
        threads = int(os.environ.get("OMP_NUM_THREADS") or local_worker_threads(self.count))
        self.ray = RayWorkers(self.address, self.count, self.secret, devices, self.timeout_s, threads, opener)
        for rank in range(1, self.count + 1):
            self.ray.launch(rank)

    def respawns(self, rank: int) -> bool:
        """Whether a lost worker ``rank`` is started again here (a local process or a Ray actor)."""
        return rank in self.procs or (self.ray is not None and 1 <= rank <= self.count)

    def spawn(self, rank: int) -> None:
        """Start local worker ``rank`` (``python -m stagewise worker --join 127.0.0.1:PORT``), or place its
        Ray actor again."""
        if self.ray is not None:
            self.ray.launch(rank)
            return
        env = dict(os.environ)
        for key, value in WORKER_ENV.items():
            env.setdefault(key, value)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # local workers share this host's cores: each its share (as many workers compute at once as
        # micro-batches are in flight; more threads than cores would leave every one of them waiting)
        env.setdefault("OMP_NUM_THREADS", str(local_worker_threads(self.count)))
        if "lo" in {name for _, name in socket.if_nameindex()}:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the data group's sockets stay on loopback too
        env[SECRET_ENV] = self.secret.decode()
        env.pop("STAGEWISE_WORKER_SECRET_FILE", None)
        cmd = [sys.executable, "-m", "stagewise", "worker", "--join", f"{self.mode.connect_host}:{self.port}",
               "--rank", str(rank), "--timeout", f"{self.timeout_s:g}", "--local"]
        self.procs[rank] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def kill(self, rank: int) -> None:
        """SIGKILL local worker ``rank`` (a hung one) and reap it, or kill its Ray actor."""
        if self.ray is not None:
            self.ray.kill(rank)
        proc = self.procs.get(rank)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)

    def kill_local(self) -> None:
        for rank in list(self.procs):
            self.kill(rank)

    # ----- joining -------------------------------------------------------------------------------

    def report(self, rank: int) -> JoinReport | None:
        """The latest genuine JoinReport of ``rank`` (None if it never joined)."""
        with self.plane.lock:
            return self.plane.joins.get(rank)

    def fresh_join(self, rank: int) -> JoinReport | None:
        """A JoinReport of ``rank`` newer than the member in use (a restarted worker), else None;
        an incarnation admitted before (a replayed report) never counts as fresh."""
        report = self.report(rank)
        current = self.members.get(rank)
        if report is None or (current is not None and report.incarnation == current.incarnation):
            return None
        if report.incarnation in self._seen.get(rank, set()):
            return None
        return report

    def wait_joins(self, ranks: list[int], timeout_s: float) -> dict[int, JoinReport]:
        """Wait until each of ``ranks`` has a fresh JoinReport; :class:`WorkerNotJoined` otherwise
        (at once when a local worker exits before joining)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = {r: rep for r in ranks if (rep := self.fresh_join(r)) is not None}
            if len(found) == len(ranks):
                return found
            missing = [r for r in ranks if r not in found]
            for rank in missing:
                proc = self.procs.get(rank)
                if proc is not None and proc.poll() is not None:
                    raise WorkerNotJoined(f"local worker {rank} exited with code {proc.returncode} before joining")
            if time.monotonic() > deadline:
                how = "their Ray actors' logs say why" if self.ray is not None else "start them with " + " ".join(
                    f"`stagewise worker --join HOST:{self.port} --rank {r}`" for r in missing)
                raise WorkerNotJoined(f"worker rank(s) {missing} did not join {self.address} within "
                                      f"{timeout_s:g} s ({how})")
            # a join wakes this at once; the timeout only bounds how late a local worker's exit is seen
            self.plane.wait(lambda: all(self.fresh_join(r) is not None for r in ranks), PROCESS_CHECK_S)

    def admit(self, report: JoinReport) -> None:
        """Make ``report``'s incarnation the member of its rank; its heartbeat clock starts now."""
        self.members[report.rank] = report
        self._seen.setdefault(report.rank, set()).add(report.incarnation)
        self._admitted[report.rank] = time.monotonic()

    def incarnations(self) -> dict[int, str]:
        return {rank: m.incarnation for rank, m in sorted(self.members.items())}

    # ----- liveness ------------------------------------------------------------------------------

    def exited(self, rank: int) -> bool:
        proc = self.procs.get(rank)
        return proc is not None and proc.poll() is not None

    def stale(self, rank: int) -> bool:
        """True when ``rank``'s heartbeats stopped (or never came) for ``heartbeat_timeout_s``."""
        member = self.members.get(rank)
        if member is None:
            return False
        last = max(self.plane.last_beat(member.incarnation) or 0.0, self._admitted.get(rank, 0.0))
        return time.monotonic() - last > self.heartbeat_timeout_s

    def dead(self) -> dict[int, str]:
        """Ranks that are gone, with why: process exit or silent heartbeats."""
        out: dict[int, str] = {}
        for rank in sorted(self.members):
            if self.exited(rank):
                out[rank] = f"its process exited (code {self.procs[rank].returncode})"
            elif self.stale(rank):
                out[rank] = f"no heartbeat for {self.heartbeat_timeout_s:g} s"
        return out

    def close(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for local workers to exit (after an ``exit`` command), then kill."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_local()
        if self.ray is not None:
            self.ray.close()
        self.plane.close()


def _kill_at_exit(ref: weakref.ref[WorkerPool]) -> None:
    """atexit: leave no local worker behind, whatever happened to the coordinator."""
    pool = ref()
    if pool is not None:
        pool.kill_local()
