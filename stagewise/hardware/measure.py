"""On-device measurement: memory bandwidth, matmul rate, link bandwidth and latency.

Results are cached per machine under ``~/.cache/stagewise/measure-<key>.json`` where the key
hashes the host name, the devices' UUIDs (or ids) and the NVIDIA driver version, so a driver
update or a swapped card re-measures. torch is imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from stagewise.hardware.topology import Topology

ACTIVATION_BYTES = 8 << 10  # one decode token's hidden state (4096 x bf16)
LARGE_BYTES = 64 << 20
SAME_MODEL_TOLERANCE = 0.10  # measured spread between identical GPUs treated as noise
DEVICE_COPY_BYTES = 2 << 30  # GPU copy: 2 GiB read + 2 GiB written, past any L2
_REPEATS = 5


def cache_dir() -> Path:
    """stagewise's cache (measurements, the demo model): ``$STAGEWISE_CACHE``,
    ``$XDG_CACHE_HOME/stagewise`` or ``~/.cache/stagewise``."""
    if os.environ.get("STAGEWISE_CACHE"):
        return Path(os.environ["STAGEWISE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stagewise"


def _cache_path(topology: Topology) -> Path:
    return cache_dir() / f"measure-{machine_key(topology)}.json"


def machine_key(topology: Topology) -> str:
    from stagewise.hardware.discovery import driver_version

    parts = [os.uname().nodename, driver_version()] + [d.uuid or d.id for d in topology.devices]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def measure_topology(topology: Topology, use_cache: bool = True) -> tuple[Topology, dict[str, Any]]:
    """Measure every executable device and each pair's link; return the updated topology and
    the raw figures (``{"devices": {id: {...}}, "links": {"a|b": {...}}}``)."""
    path = _cache_path(topology)
    figures: dict[str, Any] | None = None
    if use_cache and path.exists():
        try:
            figures = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            figures = None
    if figures is None:
        figures = _measure(topology)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=1))
    return apply_figures(topology, figures), figures


def apply_cached(topology: Topology) -> Topology:
    """``topology`` with this machine's cached measurements applied, if any were taken (no timing)."""
    path = _cache_path(topology)
    try:
        return apply_figures(topology, json.loads(path.read_text())) if path.exists() else topology
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return topology


def _same_model_figures(topology: Topology, figures: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per device, its measured figures; devices of one model whose figures lie within
    SAME_MODEL_TOLERANCE of each other share their mean (identical parts: the rest is noise)."""
    measured = {d.id: dict(figures.get("devices", {}).get(d.id) or {}) for d in topology.devices}
    by_name: dict[str, list[str]] = {}
    for d in topology.devices:
        if measured[d.id]:
            by_name.setdefault(f"{d.kind}|{d.name}", []).append(d.id)
    for ids in by_name.values():
        for key in ("memory_bandwidth_bytes_per_s", "matmul_flops_per_s"):
            values = [measured[i][key] for i in ids]
            if len(values) > 1 and max(values) <= min(values) * (1 + SAME_MODEL_TOLERANCE):
                mean = sum(values) / len(values)
                for i in ids:
                    measured[i][key] = mean
    return measured


def apply_figures(topology: Topology, figures: dict[str, Any]) -> Topology:
    """``topology`` with measured ``figures`` (the cache file's form) applied to its devices and links."""
    devices = []
    shared = _same_model_figures(topology, figures)
    for d in topology.devices:
        m = shared.get(d.id)
        if m:
            # NOTE: two significant digits: run-to-run noise must not decide a placement
            d = replace(
                d,
                memory_bandwidth_bytes_per_s=_round2(m["memory_bandwidth_bytes_per_s"]),
                matmul_flops_per_s=_round2(m["matmul_flops_per_s"]),
                measured=True,
            )
        devices.append(d)
    links = []
    for lk in topology.links:
        m = figures.get("links", {}).get(f"{lk.a}|{lk.b}")
        if m:
            lk = replace(lk, bandwidth_bytes_per_s=m["large_bandwidth_bytes_per_s"], latency_s=m["activation_s"])
            lk = replace(lk, measured=True)
        links.append(lk)
    return Topology(tuple(devices), tuple(links), topology.name)


def _round2(value: float) -> float:
    return float(f"{value:.2g}")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _median_s(fn: Any, device: str) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def copy_bandwidth_bytes_per_s(device: str, copy_bytes: int | None = None) -> float:
    """Memory bandwidth of torch device ``device`` (read + write), from the median time of copying
    ``copy_bytes`` (default: 2 GiB on a GPU, 64 MiB on a CPU, far larger than any cache)."""
    import torch

    if copy_bytes is None:
        copy_bytes = DEVICE_COPY_BYTES if device.startswith("cuda") else LARGE_BYTES
    src = torch.ones(copy_bytes // 2, dtype=torch.bfloat16, device=device)  # copy_bytes bytes
    dst = torch.empty_like(src)
    copy_s = _median_s(lambda: dst.copy_(src), device)
    return 2 * copy_bytes / copy_s  # read + write


def _measure(topology: Topology) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"devices": {}, "links": {}, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for d in topology.devices:
        if not d.executable:
            continue
        dev = d.torch_device
        gpu = dev.startswith("cuda")
        bandwidth = copy_bandwidth_bytes_per_s(dev)
        size = 8192 if gpu else 512
        a = torch.randn(size, size, dtype=torch.bfloat16 if gpu else torch.float32, device=dev)
        b = torch.randn(size, size, dtype=a.dtype, device=dev)
        mm_s = _median_s(lambda a=a, b=b: a @ b, dev)
        del a, b
        out["devices"][d.id] = {
            "memory_bandwidth_bytes_per_s": bandwidth,
            "matmul_flops_per_s": 2 * size**3 / mm_s,
        }
    for lk in topology.links:
        da, db = topology.device(lk.a), topology.device(lk.b)
        if not (da.executable and db.executable):
            continue
        small = torch.empty(ACTIVATION_BYTES, dtype=torch.uint8, device=da.torch_device)
        large = torch.empty(LARGE_BYTES, dtype=torch.uint8, device=da.torch_device)
        small_s = _median_s(lambda t=small, to=db.torch_device: t.to(to), db.torch_device)
        large_s = _median_s(lambda t=large, to=db.torch_device: t.to(to), db.torch_device)
        out["links"][f"{lk.a}|{lk.b}"] = {
            "activation_s": small_s,
            "activation_bandwidth_bytes_per_s": ACTIVATION_BYTES / small_s,
            "large_s": large_s,
            "large_bandwidth_bytes_per_s": LARGE_BYTES / large_s,
        }
    return out
