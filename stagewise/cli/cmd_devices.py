"""``stagewise devices``: the devices stagewise would plan on, with budgets and links.

With ``--workers N@HOST:PORT`` it waits for N ``stagewise worker --join`` processes and shows the
multi-host topology they offer (what ``--workers`` would plan on); ``--measure`` then times the
links between the workers and prints the measured figures beside the defaults. The workers are
sent home afterwards.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stagewise.errors import ConfigError
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.discovery import discover_topology
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import format_bytes
from stagewise.hardware.topology import Topology


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("devices", help="list devices, budgets and links")
    p.add_argument("--devices", metavar="SPEC", help="topology JSON or compact spec (default: discover)")
    p.add_argument("--reserve", help="reserve kept from free memory: 2GiB, 8%%, cuda=1GiB,cpu=10%%")
    p.add_argument("--measure", action="store_true", help="time bandwidth, matmul rate and links (cached); "
                   "with --workers: time the links between the workers")
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
    p.add_argument("--workers", metavar="N@HOST:PORT", help="list the devices of N workers that join "
                   "(`stagewise worker --join HOST:PORT --rank K`), as one topology across hosts")
    p.add_argument("--worker-secret-file", metavar="PATH", default=None,
                   help="the secret shared with the workers (--workers; default: $STAGEWISE_WORKER_SECRET)")
    p.add_argument("--join-timeout", type=float, default=120.0, help="seconds to wait for the workers (--workers)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    owners: dict[str, int] | None = None
    if args.workers:
        datasheet, topology, owners = _cluster(args.workers, args.join_timeout, args.measure, args.worker_secret_file)
    else:
        policy = ReservePolicy.parse(args.reserve)
        # the "sheet" column must show datasheet figures, not the cached measurements that
        # resolve_device_spec applies by default for planning
        datasheet = resolve_device_spec(args.devices, policy, discover=lambda: discover_topology(policy))
        if args.measure:
            from stagewise.hardware.measure import measure_topology

            topology, _ = measure_topology(datasheet)
        else:
            topology = resolve_device_spec(args.devices, policy)
    if args.json:
        out = topology.to_dict()
        out["links_resolved"] = [
            _link_dict(topology, datasheet, a.id, b.id, beside_default=owners is not None)
            for i, a in enumerate(topology.devices) for b in topology.devices[i + 1 :]
        ]
        if owners is not None:
            out["workers"] = owners  # device id -> the rank of the worker that offers it
        print(json.dumps(out, indent=1))
        return 0
    _render(topology, datasheet, owners)
    return 0


def _cluster(workers: str, join_timeout_s: float, measure: bool,
             secret_file: str | None = None) -> tuple[Topology, Topology, dict[str, int]]:
    """(default-figure topology, shown topology, device id -> worker rank) of the joining workers."""
    from stagewise.runtime.cluster_links import measure_cluster_links
    from stagewise.runtime.distributed_start import cluster_topology, open_pool, refuse
    from stagewise.runtime.worker_mode import WorkerMode

    if WorkerMode.parse(workers).local:
        raise ConfigError("devices --workers takes N@HOST:PORT (local workers offer this machine's devices: "
                          "run `stagewise devices`)")
    pool = open_pool(workers, secret_file=secret_file)
    cluster, joins = cluster_topology(pool, join_timeout_s, measure_links=False)
    try:
        measured = measure_cluster_links(pool, joins, cluster)[0] if measure else cluster
    except BaseException as exc:
        refuse(pool, joins, str(exc))
        raise
    refuse(pool, joins, "`stagewise devices` only listed the devices")
    return cluster.topology, measured.topology, measured.owners


def _link_dict(topology: Topology, datasheet: Topology, a: str, b: str, beside_default: bool) -> dict[str, Any]:
    lk = topology.link(a, b)
    out = lk.to_dict()
    if beside_default and lk.measured:
        default = datasheet.link(a, b)
        out["default"] = {"bandwidth": default.bandwidth_bytes_per_s, "latency_s": default.latency_s}
    return out


def _render(topology: Topology, datasheet: Topology, owners: dict[str, int] | None = None) -> None:
    from rich.table import Table

    from stagewise.console import console as make_console

    columns = ["id", "name", "torch", "memory", "free", "budget", "bandwidth GB/s", "matmul TFLOP/s", "pci", "uuid"]
    if owners is not None:
        columns.insert(1, "host (worker)")
    table = Table(*columns)
    for d in topology.devices:
        ds = datasheet.device(d.id)
        bw = f"{d.memory_bandwidth_bytes_per_s / 1e9:.0f}"
        fl = f"{d.matmul_flops_per_s / 1e12:.1f}"
        if d.measured:
            bw += f" (sheet {ds.memory_bandwidth_bytes_per_s / 1e9:.0f})"
            fl += f" (sheet {ds.matmul_flops_per_s / 1e12:.1f})"
        where = [f"{d.host} ({owners[d.id]})"] if owners is not None else []
        table.add_row(
            d.id, *where, d.name, d.torch_device or "-", format_bytes(d.memory_bytes),
            format_bytes(d.free_bytes) if d.free_bytes is not None else "-",
            format_bytes(d.budget_bytes), bw, fl, d.pci_bus_id or "-", d.uuid or "-",
        )
    console = make_console()
    console.print(table)
    if len(topology.devices) > 1:
        links = Table("a", "b", "kind", "GB/s", "latency us", "peer")
        for i, a in enumerate(topology.devices):
            for b in topology.devices[i + 1 :]:
                lk = topology.link(a.id, b.id)
                gbs, lat = f"{lk.bandwidth_bytes_per_s / 1e9:.1f}", f"{lk.latency_s * 1e6:.1f}"
                if owners is not None and lk.measured:  # a link between workers, timed: beside its default
                    default = datasheet.link(a.id, b.id)
                    gbs += f" (default {default.bandwidth_bytes_per_s / 1e9:.1f})"
                    lat += f" (default {default.latency_s * 1e6:.1f})"
                links.add_row(a.id, b.id, lk.kind, gbs, lat, str(lk.peer_access))
        console.print(links)
        if owners is not None and any(lk.measured for lk in topology.links):
            console.print("Links between workers were timed by the workers (ping-pong); defaults in parentheses.")
