"""Device orders to try for a k-stage pipeline, deduplicated by interchangeable devices.

Two devices are interchangeable when swapping them changes no cost: same budget, bandwidth,
FLOPs, host and torch device kind, and the same link (kind, bandwidth, latency) to every other
device. Orders are enumerated as sequences of interchangeability classes, each class used in
canonical device order, so eight identical GPUs give one order per k instead of 8!/(8-k)!.
Enumeration is bounded by ``max_orders``; past it the search is marked not exhaustive.
"""

from __future__ import annotations

from collections.abc import Iterator

from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.topology import Topology

MAX_ORDERS = 50_000


def _link_sig(topology: Topology, a: str, b: str) -> tuple[str, float, float]:
    lk = topology.link(a, b)
    return (lk.kind, lk.bandwidth_bytes_per_s, lk.latency_s)


def _device_sig(d: DeviceInfo) -> tuple[object, ...]:
    return (d.budget_bytes, d.memory_bandwidth_bytes_per_s, d.matmul_flops_per_s, d.host, d.kind)


def interchangeable_classes(topology: Topology, devices: list[DeviceInfo]) -> list[list[DeviceInfo]]:
    """Partition ``devices`` (canonical order kept) into pairwise-interchangeable classes."""
    classes: list[list[DeviceInfo]] = []
    for d in devices:
        for cls in classes:
            if all(_swappable(topology, devices, d, other) for other in cls):
                cls.append(d)
                break
        else:
            classes.append([d])
    return classes


def _swappable(topology: Topology, devices: list[DeviceInfo], x: DeviceInfo, y: DeviceInfo) -> bool:
    if _device_sig(x) != _device_sig(y):
        return False
    for z in devices:
        if z.id in (x.id, y.id):
            continue
        if _link_sig(topology, x.id, z.id) != _link_sig(topology, y.id, z.id):
            return False
    return True


def class_orders(classes: list[list[DeviceInfo]], k: int) -> Iterator[list[DeviceInfo]]:
    """Every k-device order up to swaps within a class, in a deterministic order."""
    remaining = [len(c) for c in classes]
    used = [0] * len(classes)
    sequence: list[DeviceInfo] = []

    def walk() -> Iterator[list[DeviceInfo]]:
        if len(sequence) == k:
            yield list(sequence)
            return
        for ci, cls in enumerate(classes):
            if remaining[ci] == 0:
                continue
            remaining[ci] -= 1
            sequence.append(cls[used[ci]])
            used[ci] += 1
            yield from walk()
            used[ci] -= 1
            sequence.pop()
            remaining[ci] += 1

    yield from walk()
