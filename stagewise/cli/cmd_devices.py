"""``stagewise devices``: the devices stagewise would plan on, with budgets and links."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import format_bytes
from stagewise.hardware.topology import Topology


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("devices", help="list devices, budgets and links")
    p.add_argument("--devices", metavar="SPEC", help="topology JSON or compact spec (default: discover)")
    p.add_argument("--reserve", help="reserve kept from free memory: 2GiB, 8%%, cuda=1GiB,cpu=10%%")
    p.add_argument("--measure", action="store_true", help="time bandwidth, matmul rate and links (cached)")
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    datasheet = resolve_device_spec(args.devices, ReservePolicy.parse(args.reserve))
    topology = datasheet
    if args.measure:
        from stagewise.hardware.measure import measure_topology

        topology, _ = measure_topology(datasheet)
    if args.json:
        out = topology.to_dict()
        out["links_resolved"] = [
            topology.link(a.id, b.id).to_dict() for i, a in enumerate(topology.devices) for b in topology.devices[i + 1 :]
        ]
        print(json.dumps(out, indent=1))
        return 0
    _render(topology, datasheet)
    return 0


def _render(topology: Topology, datasheet: Topology) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("id", "name", "torch", "memory", "free", "budget", "bandwidth GB/s", "matmul TFLOP/s", "pci", "uuid")
    for d in topology.devices:
        ds = datasheet.device(d.id)
        bw = f"{d.memory_bandwidth_bytes_per_s / 1e9:.0f}"
        fl = f"{d.matmul_flops_per_s / 1e12:.1f}"
        if d.measured:
            bw += f" (sheet {ds.memory_bandwidth_bytes_per_s / 1e9:.0f})"
            fl += f" (sheet {ds.matmul_flops_per_s / 1e12:.1f})"
        table.add_row(
            d.id, d.name, d.torch_device or "-", format_bytes(d.memory_bytes),
            format_bytes(d.free_bytes) if d.free_bytes is not None else "-",
            format_bytes(d.budget_bytes), bw, fl, d.pci_bus_id or "-", d.uuid or "-",
        )
    console = Console()
    console.print(table)
    if len(topology.devices) > 1:
        links = Table("a", "b", "kind", "GB/s", "latency us", "peer")
        for i, a in enumerate(topology.devices):
            for b in topology.devices[i + 1 :]:
                lk = topology.link(a.id, b.id)
                links.add_row(a.id, b.id, lk.kind, f"{lk.bandwidth_bytes_per_s / 1e9:.1f}", f"{lk.latency_s * 1e6:.1f}", str(lk.peer_access))
        console.print(links)
