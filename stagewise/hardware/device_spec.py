"""``--devices SPEC``: a topology file or a compact string, turned into a :class:`Topology`.

Compact forms (comma separated, mixable):

* ``24GiB`` / ``4x24GiB`` — simulated devices ``sim:0``, ``sim:1``… (plan only; default speeds
  in :mod:`stagewise.hardware.defaults`).
* ``cpu:2x4GiB`` / ``cpu:4GiB`` — virtual CPU devices ``cpu:0``, ``cpu:1``… that really execute
  (all on torch device ``"cpu"``), each with its own budget.
* ``cuda:0@22.76GB`` / ``cuda:1`` / ``1`` / ``GPU-<uuid>@20GiB`` — real devices (by id, index
  or UUID), optionally with a capped budget; resolved against discovery.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from stagewise.errors import TopologyError
from stagewise.hardware import defaults
from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import parse_bytes
from stagewise.hardware.topology import Topology
from stagewise.hardware.topology_file import read_topology_file

_COUNT_SIZE = re.compile(r"^(?:(\d+)\s*x\s*)?(-?[0-9.]+\s*[a-zA-Z]*)$")
_REAL = re.compile(r"^(cuda|cpu|mps|xpu):(\d+)$")
Discover = Callable[[], Topology]


def is_topology_file(spec: str) -> bool:
    return spec.endswith(".json") or "/" in spec or Path(spec).is_file()


def parse_device_spec(spec: str) -> tuple[DeviceInfo, ...]:
    """Parse a compact SPEC without touching hardware.

    Real devices (``cuda:0@22.76GB``) come back with ``budget_bytes`` = the cap (or 0 if none),
    ``memory_bytes`` = the cap, and default speeds; :func:`resolve_device_spec` fills in the
    discovered figures. A UUID entry gets a provisional id ``cuda:<position>``.
    """
    return tuple(d for d, _ in _parse(spec))


def _parse(spec: str) -> list[tuple[DeviceInfo, bool]]:
    """Entries as (device, is_real): real ones still need discovery."""
    if not spec or not spec.strip():
        raise TopologyError("--devices: empty device spec")
    out: list[tuple[DeviceInfo, bool]] = []
    sim = cpu = 0
    for position, raw in enumerate(p.strip() for p in spec.split(",")):
        where = f"--devices entry {position} ({raw!r})"
        if not raw:
            raise TopologyError(f"{where}: empty entry")
        target, _, cap = raw.partition("@")
        if cap:  # a real device with a capped budget
            out.append((_real(target, parse_bytes(cap, f"{where}: budget"), position, where), True))
            continue
        if raw.startswith("cpu:") and not raw[4:].isdigit():
            count, size = _count_size(raw[4:], where)
            for _ in range(count):
                out.append((_virtual_cpu(cpu, size), False))
                cpu += 1
            continue
        if _REAL.match(raw) or raw.isdigit() or raw.upper().startswith(("GPU-", "MIG-")):
            out.append((_real(raw, 0, position, where), True))
            continue
        count, size = _count_size(raw, where)
        for _ in range(count):
            out.append((_simulated(sim, size), False))
            sim += 1
    return out


def resolve_device_spec(
    spec: str | None, reserve: ReservePolicy | None = None, discover: Discover | None = None
) -> Topology:
    """Turn ``--devices SPEC`` (or None: every discovered device) into a :class:`Topology`.

    ``discover`` returns the machine's topology (default: :func:`discovery.discover_topology`);
    it is called only when the spec names real devices or is None.
    """
    policy = reserve or ReservePolicy()
    if spec is not None and is_topology_file(spec):
        return read_topology_file(spec, policy)
    if discover is None:
        from stagewise.hardware.discovery import discover_topology
        from stagewise.hardware.measure import apply_cached

        def discover() -> Topology:
            return apply_cached(discover_topology(policy))  # measured beats assumed

    if spec is None:
        return discover()
    parsed = _parse(spec)
    machine = discover() if any(real for _, real in parsed) else None
    devices = [_resolve_one(d, machine) if real and machine is not None else d for d, real in parsed]
    links: tuple[Link, ...] = ()
    if machine is not None:
        ids = {d.id for d in devices}
        links = tuple(lk for lk in machine.links if lk.a in ids and lk.b in ids)
    return Topology(tuple(devices), links, name=spec)


def _resolve_one(d: DeviceInfo, machine: Topology) -> DeviceInfo:
    if d.uuid:
        found = [m for m in machine.devices if m.uuid.lower() == d.uuid.lower()]
        if not found:
            raise TopologyError(f"--devices: unknown device UUID {d.uuid!r} (visible: {', '.join(machine.ids)})")
        real = found[0]
    else:
        real = machine.device(d.id)
    if d.budget_bytes == 0:
        return real
    if d.budget_bytes > real.memory_bytes:
        raise TopologyError(
            f"--devices: budget cap {d.budget_bytes} bytes for {real.id} exceeds its memory ({real.memory_bytes} bytes)"
        )
    return replace(real, budget_bytes=d.budget_bytes)


def _count_size(text: str, where: str) -> tuple[int, int]:
    match = _COUNT_SIZE.match(text.strip())
    if not match:
        raise TopologyError(f"{where}: expected SIZE, NxSIZE, cpu:NxSIZE, KIND:INDEX[@SIZE] or a topology file")
    count = int(match.group(1) or 1)
    if not 1 <= count <= 1024:
        raise TopologyError(f"{where}: device count must be in 1..1024, got {count}")
    size = parse_bytes(match.group(2), f"{where}: size")
    if size <= 0:
        raise TopologyError(f"{where}: size must be > 0 bytes")
    return count, size


def _simulated(index: int, size: int) -> DeviceInfo:
    return DeviceInfo(
        id=f"sim:{index}",
        host="host0",
        kind="sim",
        name="simulated",
        memory_bytes=size,
        budget_bytes=size,
        memory_bandwidth_bytes_per_s=defaults.SIM_MEMORY_BANDWIDTH_BYTES_PER_S,
        matmul_flops_per_s=defaults.SIM_MATMUL_FLOPS_PER_S,
    )


def _virtual_cpu(index: int, size: int) -> DeviceInfo:
    return DeviceInfo(
        id=f"cpu:{index}",
        host="host0",
        kind="cpu",
        name="virtual cpu",
        memory_bytes=size,
        budget_bytes=size,
        memory_bandwidth_bytes_per_s=defaults.CPU_MEMORY_BANDWIDTH_BYTES_PER_S,
        matmul_flops_per_s=defaults.CPU_MATMUL_FLOPS_PER_S,
        torch_device="cpu",
    )


def _real(target: str, cap: int, position: int, where: str) -> DeviceInfo:
    target = target.strip()
    uuid = ""
    if target.isdigit():
        target = f"cuda:{target}"
    elif target.upper().startswith(("GPU-", "MIG-")):
        uuid, target = target, f"cuda:{position}"
    match = _REAL.match(target)
    if not match:
        raise TopologyError(f"{where}: unknown device {target!r} (use cuda:N, cpu:N, mps:0, xpu:N, an index or a UUID)")
    kind = match.group(1)
    is_cpu = kind == "cpu"
    bandwidth, flops = defaults.assumed_speeds(kind)
    return DeviceInfo(
        id=target,
        host="host0",
        kind=kind,
        name=kind,
        memory_bytes=cap,
        budget_bytes=cap,
        memory_bandwidth_bytes_per_s=bandwidth,
        matmul_flops_per_s=flops,
        torch_device="cpu" if is_cpu else target,
        uuid=uuid,
    )
