"""Measuring the links between joined workers: the coordinator's side of :class:`LinkProbe`.

Before planning on a multi-host topology, the coordinator times one representative pair of devices
per pair of workers (every pair of workers may end up adjacent in the pipeline), at one decode
activation and at one large transfer, and writes the figures into every link between those two
workers' devices (:func:`with_measured_links`). The planner's cost model then prices a cross-host
hop from what the network really did, not from the ``network`` default.

Bounded: one short-lived process group, ``repeats`` round trips per size and pair; on CPU/Gloo
over loopback it takes a few hundred milliseconds. Nothing is cached across runs.
"""

from __future__ import annotations

from itertools import combinations

from stagewise.errors import WorkerNotJoined
from stagewise.hardware.device_info import DeviceInfo
from stagewise.runtime.distributed_group import choose_backend
from stagewise.runtime.distributed_topology import ClusterTopology, with_measured_links
from stagewise.runtime.link_probe import LinkFigures, LinkProbe, ProbePair
from stagewise.runtime.worker_messages import JoinReport, ProbeRequest
from stagewise.runtime.worker_pool import WorkerPool

ACTIVATION_BYTES = 4096 * 2  # one decode token's hidden state: 4096 x bf16
NCCL_LARGE_BYTES = 64 << 20  # past any latency: the link's bandwidth
GLOO_LARGE_BYTES = 4 << 20  # Gloo goes through host sockets: smaller keeps the probe short
REPEATS = 5
REPORT_GRACE_S = 5.0  # beyond the probe's own timeout, for the slowest worker to answer


def representative(devices: list[DeviceInfo]) -> DeviceInfo | None:
    """The device a worker times its links from: its first executable CUDA device, else its first
    executable device (canonical order); None when it offers none it can run on."""
    runnable = [d for d in devices if d.executable]
    return next((d for d in runnable if d.torch_device.startswith("cuda")), runnable[0] if runnable else None)


def probe_pairs(cluster: ClusterTopology) -> tuple[ProbePair, ...]:
    """One pair per pair of workers (rank order), each between the two workers' representatives."""
    reps: dict[int, DeviceInfo] = {}
    for rank in sorted(set(cluster.owners.values())):
        rep = representative([d for d in cluster.topology.devices if cluster.owners[d.id] == rank])
        if rep is not None:
            reps[rank] = rep
    return tuple(ProbePair(a, reps[a].torch_device, b, reps[b].torch_device) for a, b in combinations(sorted(reps), 2))


def measure_cluster_links(pool: WorkerPool, joins: dict[int, JoinReport], cluster: ClusterTopology,
                          activation_bytes: int = ACTIVATION_BYTES, large_bytes: int | None = None,
                          repeats: int = REPEATS) -> tuple[ClusterTopology, tuple[LinkFigures, ...]]:
    """Have the joined workers time the links between them; return the cluster with those links
    measured, and the raw figures.

    ``large_bytes`` defaults to 64 MiB over NCCL, 4 MiB over Gloo. Every joined worker takes part
    (it is in the probe group even without a pair). Raises :class:`WorkerNotJoined` naming the
    workers when one does not answer within the pool's timeout or a pair cannot be timed (the
    data group would fail the same way); the caller sends the workers home.
    """
    pairs = probe_pairs(cluster)
    if not pairs:
        return cluster, ()
    backend = choose_backend(sorted({p.a_device for p in pairs} | {p.b_device for p in pairs}))
    large = large_bytes or (NCCL_LARGE_BYTES if backend == "nccl" else GLOO_LARGE_BYTES)
    pool.probes += 1
    n = pool.probes
    probe = LinkProbe(n, pool.count, backend, pairs, activation_bytes, large, repeats, pool.timeout_s)
    pool.plane.expect_probe(n)
    for rank, report in sorted(joins.items()):
        pool.plane.send([(rank, report.incarnation)], ProbeRequest(incarnation=report.incarnation, probe=probe))
    wait_s = pool.timeout_s + REPORT_GRACE_S
    if not pool.plane.wait(lambda: set(pool.plane.probe_reports(n)) >= set(joins), wait_s):
        missing = sorted(set(joins) - set(pool.plane.probe_reports(n)))
        raise WorkerNotJoined(f"worker(s) {missing} did not finish timing the links between workers within "
                              f"{wait_s:g} s")
    reports = pool.plane.probe_reports(n)
    failed = {rank: r.error for rank, r in reports.items() if not r.ok}
    if failed:
        why = "; ".join(f"worker {rank} ({joins[rank].host}): {error}" for rank, error in sorted(failed.items()))
        raise WorkerNotJoined(f"could not time the links between workers ({why}); check that the hosts reach "
                              "each other (docs/multihost.md), or plan on default link figures "
                              "(load_model(measure_links=False))")
    figures = tuple(f for r in reports.values() for f in r.figures if f.usable)
    return with_measured_links(cluster, figures), figures
