"""RayWorkers: worker processes placed as Ray actors on an existing Ray cluster (``--workers ray:N``).

Instead of waiting for N ``stagewise worker --join`` processes, the coordinator connects to the Ray
cluster (``ray:N@ADDRESS``, else ``$RAY_ADDRESS`` or the local instance: ``ray.init(address="auto")``,
or the one this process already joined; ``ray``: N is the cluster's GPU count), listens on its own node's address and places N worker
actors: each holds one GPU when the cluster has N GPUs (Ray sets its ``CUDA_VISIBLE_DEVICES``), else
one CPU. Each actor runs the ordinary worker (:func:`run_worker`) on a thread of its own: it joins
the same control plane with a fresh secret handed over in its constructor, offers the devices it
sees (or ``devices``), and from there on it is a worker like any other — the links between actors
are timed, the plan is made on what they offer and the certified plan's stages go to their devices.

A lost actor is replaced (a new actor of the same rank rejoins, as a restarted local worker does);
closing kills every actor. Ray is optional (``pip install 'stagewise[ray]'``): without it,
``--workers ray:N`` is refused with :class:`ConfigError`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from stagewise.errors import ConfigError, StagewiseError
from stagewise.runtime.distributed_group import WORKER_ENV

if TYPE_CHECKING:
    from stagewise.runtime.worker_segment import Opener


def ray_module() -> Any:
    """The ``ray`` package; :class:`ConfigError` saying how to get it when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--workers ray:N needs Ray: pip install 'stagewise[ray]'") from None
    return ray


def connect_ray(address: str | None) -> str:
    """Join the Ray cluster at ``address`` (None: ``$RAY_ADDRESS`` or a running local instance) unless
    this process already did; returns this node's IP (where the coordinator listens)."""
    ray = ray_module()
    if not ray.is_initialized():
        try:
            ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot join the Ray cluster at {address or 'auto'} ({exc})"[:300]) from None
    return str(ray.util.get_node_ip_address())


def cluster_gpus() -> int:
    """The GPUs of the joined Ray cluster (``--workers ray``: one worker actor each); :class:`ConfigError`
    when it has none (then say how many workers: ``ray:N``)."""
    gpus = int(ray_module().cluster_resources().get("GPU", 0))
    if gpus < 1:
        raise ConfigError("--workers ray places one worker per GPU, and this Ray cluster has none: "
                          "give the number of workers (ray:N)")
    return gpus


class RayWorkerActor:
    """One worker inside a Ray actor: ``run_worker`` on a thread (the actor's methods stay free)."""

    def __init__(self, join: str, rank: int, secret: bytes, devices: str | None, timeout_s: float,
                 threads: int, opener: Opener) -> None:
        for key, value in WORKER_ENV.items():
            os.environ.setdefault(key, value)
        self.code: int | None = None
        args = (join, rank, secret, devices, timeout_s, threads, opener)
        threading.Thread(target=self._run, args=args, name="stagewise-worker", daemon=True).start()

    def _run(self, join: str, rank: int, secret: bytes, devices: str | None, timeout_s: float, threads: int,
             opener: Opener) -> None:
        import torch

        from stagewise.hardware.device_spec import resolve_device_spec
        from stagewise.runtime.worker import run_worker

        torch.set_num_threads(threads)
        try:
            topology = resolve_device_spec(devices).to_dict()
            self.code = run_worker(join, rank, opener, topology, secret, timeout_s)
        except StagewiseError as exc:  # the coordinator sees a worker that never joined; the log says why
            print(f"stagewise worker {rank}: {exc}", file=sys.stderr, flush=True)
            self.code = exc.exit_code

    def exit_code(self) -> int | None:
        """The worker's exit code once it left (None while it serves)."""
        return self.code


class RayWorkers:
    """The actors of one pool: ``count`` ranks joining ``join`` (the pool's store address)."""

    def __init__(self, join: str, count: int, secret: bytes, devices: str | None, timeout_s: float,
                 threads: int, opener: Opener) -> None:
        self._ray = ray_module()
        self._args = (join, secret, devices, timeout_s, threads, opener)
        gpus = self._ray.cluster_resources().get("GPU", 0)
        self.gpus_per_worker = 1 if gpus >= count else 0  # one stage's device per actor
        self.actors: dict[int, Any] = {}

    def launch(self, rank: int) -> None:
        """Place the actor of ``rank`` (replacing a previous one)."""
        self.kill(rank)
        join, secret, devices, timeout_s, threads, opener = self._args
        cls = self._ray.remote(num_gpus=self.gpus_per_worker, num_cpus=0 if self.gpus_per_worker else 1,
                               max_restarts=0)(RayWorkerActor)
        self.actors[rank] = cls.options(name=None).remote(join, rank, secret, devices, timeout_s, threads, opener)

    def kill(self, rank: int) -> None:
        actor = self.actors.pop(rank, None)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def close(self, timeout_s: float = 30.0) -> None:
        """Kill every actor and return once each is gone (Ray kills asynchronously: an actor may answer
        a call made right after its kill), or after ``timeout_s``."""
        actors = list(self.actors.values())
        for rank in list(self.actors):
            self.kill(rank)
        deadline = time.monotonic() + timeout_s
        for actor in actors:
            while time.monotonic() < deadline:
                try:
                    self._ray.get(actor.exit_code.remote(), timeout=max(0.1, deadline - time.monotonic()))
                except self._ray.exceptions.RayActorError:
                    break  # dead
                except self._ray.exceptions.GetTimeoutError:
                    break  # the bound passed
                time.sleep(0.05)  # it answered: the kill has not reached it yet
