"""The multi-host topology: every joined worker's devices in one :class:`Topology`.

Each worker reports its devices with ids local to it (``cuda:0`` on every host). The coordinator
renumbers them per kind in rank order (worker 1's ``cuda:0, cuda:1`` stay, worker 2's ``cuda:0``
becomes ``cuda:2``), keeps each device's ``torch_device`` as the worker sees it and stamps it with
the worker's host, so pairs on different hosts default to ``network`` links, which the planner
costs as such. ``owners`` maps each global device id to the rank that runs it.
:func:`with_measured_links` replaces those defaults with what the workers measured
(:mod:`stagewise.runtime.cluster_links`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stagewise.errors import TopologyError
from stagewise.hardware.link import Link
from stagewise.hardware.topology import Topology
from stagewise.hardware.topology_file import topology_from_dict
from stagewise.runtime.link_probe import LinkFigures
from stagewise.runtime.worker_messages import JoinReport


@dataclass(frozen=True)
class ClusterTopology:
    """The merged topology and who owns each device (global id -> worker rank)."""

    topology: Topology
    owners: dict[str, int]


def merge_reports(reports: dict[int, JoinReport]) -> ClusterTopology:
    """Merge the workers' reported topologies (rank order); links between workers are added by
    :func:`with_measured_links`. Raises :class:`TopologyError` naming the worker on a bad report."""
    counters: dict[str, int] = {}
    devices = []
    renamed_links: list[Link] = []
    owners: dict[str, int] = {}
    for rank in sorted(reports):
        report = reports[rank]
        local = topology_from_dict(report.topology, f"worker {rank} ({report.host})")
        names: dict[str, str] = {}
        for d in local.devices:
            index = counters.get(d.kind, 0)
            counters[d.kind] = index + 1
            names[d.id] = f"{d.kind}:{index}"
            devices.append(replace(d, id=names[d.id], host=report.host))
            owners[names[d.id]] = rank
        for lk in local.links:
            renamed_links.append(replace(lk, a=names[lk.a], b=names[lk.b]))
    if not devices:
        raise TopologyError("no worker offered any device")
    return ClusterTopology(Topology(tuple(devices), tuple(renamed_links), name="cluster"), owners)


def with_measured_links(cluster: ClusterTopology, figures: tuple[LinkFigures, ...]) -> ClusterTopology:
    """``cluster`` with every link between a device of worker ``a_rank`` and one of ``b_rank`` set to
    that pair's measured figures (``measured=True``): bandwidth from the large transfer, latency
    from the activation-sized one (as ``stagewise devices --measure`` does in one process).

    All device pairs of two workers share the figures of their representative pair, so identical
    devices on one host stay interchangeable for the planner. The kind stays the default's
    (``network`` across hosts), except that two workers never share a ``same-device`` link.
    """
    topo = cluster.topology
    by_ranks = {(f.a_rank, f.b_rank): f for f in figures}
    measured: list[Link] = []
    for i, da in enumerate(topo.devices):
        for db in topo.devices[i + 1 :]:
            ra, rb = sorted((cluster.owners[da.id], cluster.owners[db.id]))
            f = by_ranks.get((ra, rb))
            if ra == rb or f is None:
                continue
            kind = topo.link(da.id, db.id).kind
            kind = "pcie-host-staged" if kind == "same-device" else kind
            # NOTE: two significant digits, as for measured devices: run-to-run noise must not decide a placement
            measured.append(Link(da.id, db.id, kind, _round2(f.bandwidth_bytes_per_s), _round2(f.latency_s),
                                 measured=True))
    keys = {lk.key for lk in measured}
    kept = tuple(lk for lk in topo.links if lk.key not in keys)
    return ClusterTopology(Topology(topo.devices, kept + tuple(measured), topo.name), cluster.owners)


def _round2(value: float) -> float:
    return float(f"{value:.2g}")


def stage_owners(device_ids: list[str], owners: dict[str, int]) -> list[int]:
    """The worker rank of each stage's device; each worker's stages must be contiguous."""
    ranks = [owners[d] for d in device_ids]
    seen: set[int] = set()
    for k, rank in enumerate(ranks):
        if rank in seen and ranks[k - 1] != rank:
            raise TopologyError(f"worker {rank}'s stages are not contiguous in the placement ({device_ids}); "
                                "give each host's devices a contiguous block of the pipeline")
        seen.add(rank)
    return ranks
