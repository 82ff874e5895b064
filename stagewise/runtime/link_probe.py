"""LinkProbe: joined workers ping-pong each other, before planning, to time the links between them.

When workers join, the coordinator knows their devices but not the network between them. Before it
plans, it sends every joined worker the same :class:`LinkProbe` on the control plane (inside a
:class:`~stagewise.runtime.worker_messages.ProbeRequest`): the pairs of workers to time, each with the
torch device a stage would use on either side, and two message sizes (one decode activation, one
large transfer). Every worker joins a short-lived process group (store prefix ``probe-pg/{n}``), runs
the pairs it is part of in the listed order (one global order, so no two workers wait on each other
crosswise), leaves the group and answers with a :class:`ProbeReport`; the lower rank of each pair
reports its figures. The records travel as the plane's messages do (checked while decoded).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.errors import TopologyError
from stagewise.runtime.distributed_group import join_group, leave_group, measure_link, wire_device


@dataclass(frozen=True)
class ProbePair:
    """Two workers (ranks >= 1, ``a_rank < b_rank``) and the torch device each times from."""

    a_rank: int
    a_device: str
    b_rank: int
    b_device: str

    def __post_init__(self) -> None:
        if not 1 <= self.a_rank < self.b_rank <= 4096:
            raise TopologyError(f"probe pair needs 1 <= a_rank < b_rank, got {self.a_rank}, {self.b_rank}")


@dataclass(frozen=True)
class LinkProbe:
    """Probe number ``n`` over a group of ``world`` workers (data rank = rank - 1) on ``backend``.

    Each pair is timed at ``activation_bytes`` and ``large_bytes``, ``repeats`` round trips each
    after one warm-up; ``timeout_s`` bounds joining the group and every send/receive.
    """

    n: int
    world: int
    backend: str
    pairs: tuple[ProbePair, ...]
    activation_bytes: int
    large_bytes: int
    repeats: int
    timeout_s: float

    def __post_init__(self) -> None:
        if not (self.n >= 1 and 1 <= self.world <= 4096 and 0 < self.activation_bytes <= 2**30
                and 0 < self.large_bytes <= 2**31 and 1 <= self.repeats <= 1000 and 0 < self.timeout_s <= 86400
                and self.backend in ("gloo", "nccl") and len(self.pairs) <= 4096**2):
            raise ValueError("link probe: a field is out of range")


@dataclass(frozen=True)
class LinkFigures:
    """One pair's median one-way times: ``activation_s`` for ``activation_bytes`` (the latency a
    decode handoff sees) and ``large_s`` for ``large_bytes`` (which gives the bandwidth)."""

    a_rank: int
    b_rank: int
    activation_bytes: int
    activation_s: float
    large_bytes: int
    large_s: float

    @property
    def latency_s(self) -> float:
        return self.activation_s

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.large_bytes / self.large_s if self.large_s > 0 else 0.0

    @property
    def usable(self) -> bool:
        """Both figures are positive and finite (a link can be built from them)."""
        return 0 < self.activation_s < 10 and 0 < self.large_s < float("inf")


@dataclass(frozen=True)
class ProbeReport:
    """A worker's answer to a probe: the figures of the pairs it led, or why it failed."""

    rank: int
    ok: bool
    error: str = ""
    figures: tuple[LinkFigures, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.rank <= 4096 or len(self.error) > 64 * 1024 or len(self.figures) > 4096:
            raise ValueError("probe report: a field is out of range")


def run_probe(store: torch.distributed.Store, rank: int, probe: LinkProbe) -> ProbeReport:
    """Worker side: join the probe group, time this worker's pairs in order, leave the group.

    Never raises for a failed measurement: the report says what went wrong (the coordinator decides).
    """
    mine = [p for p in probe.pairs if rank in (p.a_rank, p.b_rank)]
    figures: list[LinkFigures] = []
    try:
        own = [p.a_device if p.a_rank == rank else p.b_device for p in mine]
        device = torch.device(own[0]) if own else torch.device("cpu")
        join_group(store, probe.n, rank - 1, probe.world, probe.backend, probe.timeout_s, device, prefix="probe-pg")
        for pair, dev in zip(mine, own, strict=True):
            first = pair.a_rank == rank
            peer = (pair.b_rank if first else pair.a_rank) - 1
            wire = wire_device(probe.backend, torch.device(dev))
            small = measure_link(peer, first, wire, probe.activation_bytes, probe.repeats)
            large = measure_link(peer, first, wire, probe.large_bytes, probe.repeats)
            if first:
                figures.append(LinkFigures(pair.a_rank, pair.b_rank, probe.activation_bytes, small["one_way_s"],
                                           probe.large_bytes, large["one_way_s"]))
        return ProbeReport(rank, True, figures=tuple(figures))
    except Exception as exc:
        return ProbeReport(rank, False, f"{type(exc).__name__}: {exc}"[:60_000])
    finally:
        leave_group()
