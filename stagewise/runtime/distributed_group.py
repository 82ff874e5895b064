"""The data process group: the workers that hold stages, joined by torch.distributed.

Gloo between CPUs (and for any mix of device kinds, staging GPU activations through the host),
NCCL when every stage runs on a CUDA device. Each generation of the group gets its own store
prefix (``pg/{gen}``), so after a worker is lost the survivors and its replacement build a fresh
group without the old one's leftovers. Every collective operation is bounded by ``timeout_s``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

# NOTE: NVLink SHARP multicast must stay off for spawned workers (see the device notes).
WORKER_ENV = {"NCCL_NVLS_ENABLE": "0"}


def choose_backend(torch_devices: Sequence[str]) -> str:
    """``nccl`` when every stage device is CUDA (and NCCL is built), else ``gloo``."""
    if torch_devices and all(d.startswith("cuda") for d in torch_devices) and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def wire_device(backend: str, device: torch.device) -> torch.device:
    """Where tensors travel from: the stage's GPU for NCCL, the host for Gloo."""
    return device if backend == "nccl" else torch.device("cpu")


def join_group(store: dist.Store, gen: int, rank: int, world: int, backend: str, timeout_s: float,
               device: torch.device | None = None, prefix: str = "pg") -> None:
    """Leave any previous group, then build generation ``gen`` under store prefix ``{prefix}/{gen}``
    (blocks until all ``world`` ranks arrive, at most ``timeout_s``). A world of one needs no group."""
    leave_group()
    if world <= 1:
        return
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    if backend == "nccl" and device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.PrefixStore(f"{prefix}/{gen}", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def leave_group() -> None:
    """Destroy this process's group, if any (never raises: the group may already be broken)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def measure_link(peer: int, first: bool, device: torch.device, nbytes: int, repeats: int = 5) -> dict[str, float]:
    """Ping-pong ``nbytes`` with data rank ``peer`` over the current group, ``repeats`` times.

    Both ends call it with the same ``nbytes`` and ``repeats``; the one with ``first`` sends first.
    Returns the median one-way time ``one_way_s`` and ``bandwidth_bytes_per_s`` (bytes / one-way).
    """
    buf = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):  # the first round warms the connection up
        t0 = time.perf_counter()
        if first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / 2)
    one_way = statistics.median(times[1:])
    return {"one_way_s": one_way, "bandwidth_bytes_per_s": nbytes / one_way if one_way > 0 else 0.0}
