"""Read and write topology JSON files (format: /work/shared/reference/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stagewise.errors import TopologyError
from stagewise.hardware import defaults
from stagewise.hardware.device_info import DeviceInfo, split_device_id
from stagewise.hardware.link import Link
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import checked_bytes
from stagewise.hardware.topology import Topology


def read_topology_file(path: str | Path, reserve: ReservePolicy | None = None) -> Topology:
    """Load a topology file; devices without ``budget_bytes`` get ``reserve``'s budget.

    Raises :class:`TopologyError` naming the file and field for unreadable files, missing
    fields, negative or absurd sizes and links to unknown device ids.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TopologyError(f"{p}: cannot read topology file ({exc})") from None
    return topology_from_dict(raw, str(p), reserve)


def topology_from_dict(raw: Any, source: str = "topology", reserve: ReservePolicy | None = None) -> Topology:
    """Build a :class:`Topology` from the parsed JSON object ``raw``."""
    policy = reserve or ReservePolicy()
    if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list):
        raise TopologyError(f"{source}: field 'devices' must be a list")
    devices = tuple(_device(d, f"{source}: devices[{i}]", policy) for i, d in enumerate(raw["devices"]))
    links_raw = raw.get("links", [])
    if not isinstance(links_raw, list):
        raise TopologyError(f"{source}: field 'links' must be a list")
    links = tuple(_link(lk, f"{source}: links[{i}]") for i, lk in enumerate(links_raw))
    try:
        return Topology(devices, links, str(raw.get("name", Path(source).stem)))
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from None


def _field(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise TopologyError(f"{where}: missing field {key!r}")
    return raw[key]


def _number(raw: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = raw.get(key, default) if default is not None else _field(raw, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TopologyError(f"{where}: field {key!r} must be a positive number, got {value!r}")
    return float(value)


def _device(raw: Any, where: str, policy: ReservePolicy) -> DeviceInfo:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: must be an object")
    device_id = str(_field(raw, "id", where))
    try:
        kind, _ = split_device_id(device_id)
    except TopologyError as exc:
        raise TopologyError(f"{where}: field 'id': {exc}") from None
    memory = checked_bytes(_field(raw, "memory_bytes", where), f"{where}: field 'memory_bytes'")
    if "budget_bytes" in raw:
        budget = checked_bytes(raw["budget_bytes"], f"{where}: field 'budget_bytes'")
    else:
        budget = policy.budget_bytes(kind, memory)
    bw_default, fl_default = defaults.assumed_speeds(kind)
    try:
        return DeviceInfo(
            id=device_id,
            host=str(raw.get("host", "host0")),
            kind=kind,
            name=str(raw.get("name", device_id)),
            memory_bytes=memory,
            budget_bytes=budget,
            memory_bandwidth_bytes_per_s=_number(raw, "memory_bandwidth", where, bw_default),
            matmul_flops_per_s=_number(raw, "matmul_flops", where, fl_default),
            torch_device=str(raw.get("torch_device", "" if kind == "sim" else device_id)),
            uuid=str(raw.get("uuid", "")),
            pci_bus_id=str(raw.get("pci_bus_id", "")),
        )
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None


def _link(raw: Any, where: str) -> Link:
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: must be an object")
    between = _field(raw, "between", where)
    if not isinstance(between, list) or len(between) != 2:
        raise TopologyError(f"{where}: field 'between' must list two device ids")
    latency = raw.get("latency_s", defaults.HOST_STAGED_LATENCY_S)
    try:
        return Link(
            a=str(between[0]),
            b=str(between[1]),
            kind=str(_field(raw, "kind", where)),
            bandwidth_bytes_per_s=_number(raw, "bandwidth", where),
            latency_s=latency,
            peer_access=bool(raw.get("peer_access", False)),
            measured=raw.get("measured") is True,
        )
    except TopologyError as exc:
        raise TopologyError(f"{where}: {exc}") from None
