"""stagewise.hardware: devices, budgets and links (torch only inside discovery / measure)."""

from __future__ import annotations

from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.device_spec import parse_device_spec, resolve_device_spec
from stagewise.hardware.link import Link
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.topology import Topology
from stagewise.hardware.topology_file import read_topology_file, topology_from_dict

__all__ = [
    "DeviceInfo",
    "Link",
    "ReservePolicy",
    "Topology",
    "parse_device_spec",
    "read_topology_file",
    "resolve_device_spec",
    "topology_from_dict",
]
