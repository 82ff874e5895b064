"""Topology: the devices a model may use and the links between them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stagewise.errors import TopologyError
from stagewise.hardware import defaults
from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link


@dataclass(frozen=True)
class Topology:
    """Devices (canonically ordered: host, PCI bus id, index) and the links listed between them.

    :meth:`link` answers for any pair: a listed link, else a default. Devices that execute on
    the same torch device (virtual CPU devices) are ``same-device``; other pairs on one host are
    ``pcie-host-staged``; pairs on different hosts are ``network`` (defaults in
    :mod:`stagewise.hardware.defaults`).
    """

    devices: tuple[DeviceInfo, ...]
    links: tuple[Link, ...] = ()
    name: str = ""
    # NOTE: an index for link(), which the planner calls O(devices^3) times; derived, not compared
    _by_key: dict[tuple[str, str], Link] = field(init=False, repr=False, compare=False, default_factory=dict)
    _by_id: dict[str, DeviceInfo] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not self.devices:
            raise TopologyError("topology has no devices")
        ids = [d.id for d in self.devices]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise TopologyError(f"devices: duplicate device id {dupes[0]!r}")
        ordered = tuple(sorted(self.devices, key=lambda d: d.sort_key))
        object.__setattr__(self, "devices", ordered)
        self._by_id.update((d.id, d) for d in ordered)
        known = set(ids)
        seen: set[tuple[str, str]] = set()
        for link in self.links:
            for end in (link.a, link.b):
                if end not in known:
                    raise TopologyError(f"links: unknown device id {end!r} (devices: {', '.join(ids)})")
            if link.key in seen:
                raise TopologyError(f"links: link {link.a}-{link.b} listed twice")
            seen.add(link.key)
        object.__setattr__(self, "links", tuple(sorted(self.links, key=lambda lk: lk.key)))
        self._by_key.update((lk.key, lk) for lk in self.links)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    def device(self, device_id: str) -> DeviceInfo:
        """The device with id ``device_id``; :class:`TopologyError` naming it if unknown."""
        found = self._by_id.get(device_id)
        if found is not None:
            return found
        raise TopologyError(f"unknown device id {device_id!r} (devices: {', '.join(self.ids)})")

    def link(self, a: str, b: str) -> Link:
        """The link from ``a`` to ``b``: listed, else the documented default for the pair."""
        da, db = self.device(a), self.device(b)
        listed = self._by_key.get((a, b) if a <= b else (b, a))
        if listed is not None:
            return listed
        if a == b or (da.host == db.host and da.torch_device and da.torch_device == db.torch_device):
            bw = min(da.memory_bandwidth_bytes_per_s, db.memory_bandwidth_bytes_per_s)
            return Link(a, b, "same-device", bw, defaults.SAME_DEVICE_LATENCY_S, peer_access=True)
        if da.host != db.host:
            return Link(a, b, "network", defaults.NETWORK_BANDWIDTH_BYTES_PER_S, defaults.NETWORK_LATENCY_S)
        return Link(
            a, b, "pcie-host-staged", defaults.HOST_STAGED_BANDWIDTH_BYTES_PER_S, defaults.HOST_STAGED_LATENCY_S
        )

    def subset(self, device_ids: list[str] | tuple[str, ...]) -> Topology:
        """The topology restricted to ``device_ids`` (each must exist)."""
        keep = {self.device(i).id for i in device_ids}
        links = tuple(lk for lk in self.links if lk.a in keep and lk.b in keep)
        return Topology(tuple(d for d in self.devices if d.id in keep), links, self.name)

    def to_dict(self) -> dict[str, Any]:
        """The reference topology JSON format (see /work/shared/reference/README.md), plus our extras."""
        devices = []
        for d in self.devices:
            devices.append(
                {
                    "id": d.id,
                    "host": d.host,
                    "kind": d.kind,
                    "name": d.name,
                    "memory_bytes": d.memory_bytes,
                    "budget_bytes": d.budget_bytes,
                    "memory_bandwidth": d.memory_bandwidth_bytes_per_s,
                    "matmul_flops": d.matmul_flops_per_s,
                    "torch_device": d.torch_device,
                    "uuid": d.uuid,
                    "pci_bus_id": d.pci_bus_id,
                }
            )
        return {"name": self.name, "devices": devices, "links": [lk.to_dict() for lk in self.links]}
