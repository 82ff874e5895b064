"""WorkerMode: how ``--workers`` asked for worker processes, checked before anything is opened.

``local`` spawns one worker per stage on this machine; the rendezvous store then listens on
127.0.0.1 only. ``N@HOST:PORT`` waits for N workers started with ``stagewise worker --join``;
the store listens on HOST only (``0.0.0.0`` for every interface, an empty HOST means 127.0.0.1),
so reaching other hosts is always an explicit choice. ``ray:N`` (``ray:N@ADDRESS``: that Ray
cluster; ``ray``: one per GPU of the cluster) places N worker actors on an existing Ray cluster
(:mod:`stagewise.runtime.ray_workers`); the store then listens on this node's address in that cluster. Torch-free: the CLI and the server
settings check it before the store, a socket or a worker exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.errors import ConfigError

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class WorkerMode:
    """``local`` (count set once the plan is known), ``count`` remote workers joining ``host:port``, or
    ``count`` Ray actors (``ray``; ``ray_address``: the cluster, empty: the default one)."""

    local: bool
    count: int = 0
    host: str = LOOPBACK
    port: int = 0
    ray: bool = False
    ray_address: str = ""

    @property
    def spawned(self) -> bool:
        """The coordinator starts the workers itself (local processes or Ray actors)."""
        return self.local or self.ray

    @staticmethod
    def parse(text: str) -> WorkerMode:
        if text == "local":
            return WorkerMode(True)
        if text == "ray":
            return WorkerMode(False, 0, ray=True)  # one worker actor per GPU of the cluster
        if text.startswith("ray:"):
            count, _, address = text.removeprefix("ray:").partition("@")
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(f"--workers ray:N needs N >= 1 worker actors (ray:N@ADDRESS: that Ray cluster), "
                                  f"got {text!r}")
            return WorkerMode(False, int(count), ray=True, ray_address=address)
        count, sep, address = text.partition("@")
        host, colon, port = address.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if (not sep or not count.isdigit() or int(count) < 1 or not colon or not port.isdigit()
                or not int(port) <= 65535):
            raise ConfigError(f"--workers must be 'local', N@HOST:PORT (e.g. 2@10.0.0.5:29500; HOST is the "
                              f"address to listen on, 0.0.0.0 for every interface) or ray:N, got {text!r}")
        return WorkerMode(False, int(count), host or LOOPBACK, int(port))

    @property
    def connect_host(self) -> str:
        """Where a process on this machine reaches the store (loopback for a wildcard bind)."""
        return LOOPBACK if self.local or self.host in ("0.0.0.0", "::") else self.host


def check_worker_options(workers: str | None) -> WorkerMode | None:
    """The parsed ``--workers`` (None without it; :class:`ConfigError` when malformed). Call before
    opening anything."""
    if workers is None:
        return None
    return WorkerMode.parse(workers)
