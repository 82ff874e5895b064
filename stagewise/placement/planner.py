"""The certified placement planner: ModelSpec + Topology + Profile -> CertifiedPlacement.

Rules: a placement is legal iff every stage's charge fits its own device's budget. The
planner uses the fewest devices that legally hold the model, then the best predicted cost for
the objective; ties break on the secondary objective, then on canonical device order. User
overrides are validated and refused with a reason, never adjusted.
"""

from __future__ import annotations

from stagewise.errors import PlacementError
from stagewise.hardware.sizes import format_bytes as describe_bytes
from stagewise.hardware.topology import Topology
from stagewise.placement.certified_placement import CertifiedPlacement
from stagewise.placement.certify import certify, does_not_fit
from stagewise.placement.cost_model import OBJECTIVES
from stagewise.placement.search import Found, Searcher
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile


def plan(
    spec: ModelSpec,
    topology: Topology,
    profile: Profile | None = None,
    objective: str = "latency",
    split: list[int] | None = None,
    order: list[str] | None = None,
    max_stages: int | None = None,
    stages: int | None = None,
) -> CertifiedPlacement:
    """Plan ``spec`` on ``topology`` for ``profile`` (default :class:`Profile`).

    ``split``: blocks per stage (e.g. ``[21, 19]``); ``order``: device ids in stage order;
    ``max_stages``: at most this many stages; ``stages``: exactly this many (the best legal
    N-stage placement, or :class:`PlacementError`). Overrides that cannot be honoured raise
    :class:`PlacementError` naming the reason. Without overrides, a model that fits nowhere
    yields a ``does_not_fit`` certificate (``require_fit()`` raises :class:`DoesNotFit`).
    """
    profile = profile or Profile()
    if objective not in OBJECTIVES:
        raise PlacementError(f"objective {objective!r} must be one of {', '.join(OBJECTIVES)}")
    n_dev, n_blocks = len(topology.devices), spec.num_blocks
    fixed_order = _check_order(order, topology)
    cuts = _check_split(split, n_blocks)
    k_fixed = _check_counts(fixed_order, cuts, stages, max_stages, n_dev, n_blocks)
    devices = [topology.device(i) for i in fixed_order] if fixed_order else list(topology.devices)
    searcher = Searcher(spec, topology, profile, devices)
    if k_fixed is not None:
        found = searcher.best(k_fixed, objective, fixed_order, cuts)
        if found is None:
            raise PlacementError(_refusal(searcher, k_fixed, fixed_order, cuts))
        return certify(searcher, found, objective, _why_not_fewer(searcher, k_fixed))
    k_max = min(n_dev, n_blocks, max_stages or n_dev)
    for k in range(1, k_max + 1):
        best: Found | None = searcher.best(k, objective)
        if best is not None:
            return certify(searcher, best, objective, _why_not_fewer(searcher, k))
    return does_not_fit(searcher, objective, k_max, n_dev)


def _check_order(order: list[str] | None, topology: Topology) -> list[str] | None:
    if order is None:
        return None
    if not order:
        raise PlacementError("--order: empty device list")
    for device_id in order:
        if device_id not in topology.ids:
            raise PlacementError(f"--order: unknown device id {device_id!r} (devices: {', '.join(topology.ids)})")
    if len(set(order)) != len(order):
        raise PlacementError(f"--order: a device is listed twice in {','.join(order)}")
    return list(order)


def _check_split(split: list[int] | None, n_blocks: int) -> list[int] | None:
    if split is None:
        return None
    if not split or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in split):
        raise PlacementError(f"--split: every stage needs at least one block, got {split}")
    if sum(split) != n_blocks:
        raise PlacementError(f"--split: {'+'.join(map(str, split))} = {sum(split)} blocks, the model has {n_blocks}")
    cuts, position = [], 0
    for s in split[:-1]:
        position += s
        cuts.append(position)
    return cuts


def _check_counts(
    order: list[str] | None, cuts: list[int] | None, stages: int | None, max_stages: int | None, n_dev: int, n_blocks: int
) -> int | None:
    ks = {name: k for name, k in (("--order", len(order) if order else None), ("--split", None if cuts is None else len(cuts) + 1), ("--stages", stages)) if k is not None}
    for name, k in ks.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise PlacementError(f"{name}: stage count must be a positive integer, got {k!r}")
        if k > n_dev:
            raise PlacementError(f"{name}: {k} stages need {k} devices, only {n_dev} available")
        if k > n_blocks:
            raise PlacementError(f"{name}: {k} stages need {k} blocks, the model has {n_blocks}")
    if len(set(ks.values())) > 1:
        raise PlacementError(f"stage counts disagree: {', '.join(f'{n} gives {k}' for n, k in ks.items())}")
    if max_stages is not None:
        if isinstance(max_stages, bool) or not isinstance(max_stages, int) or max_stages < 1:
            raise PlacementError(f"--max-stages must be a positive integer, got {max_stages!r}")
        for name, k in ks.items():
            if k > max_stages:
                raise PlacementError(f"{name} asks for {k} stages but --max-stages is {max_stages}")
    return next(iter(ks.values()), None)


def _refusal(searcher: Searcher, k: int, order: list[str] | None, cuts: list[int] | None) -> str:
    miss = searcher.miss(k, order, cuts)
    what = "no legal" + (" split" if cuts else "") + f" {k}-stage placement" + (" in that order" if order else "")
    return (
        f"{what}: stage {miss.stage_index} on {miss.device_id} needs "
        f"{describe_bytes(miss.budget_bytes + miss.overflow_bytes)} > budget {describe_bytes(miss.budget_bytes)} "
        f"(over by {describe_bytes(miss.overflow_bytes)})"
    )


def _why_not_fewer(searcher: Searcher, k: int) -> tuple[str, ...]:
    if k <= 1:
        return ()
    miss = searcher.miss(k - 1)
    noun = "device" if k == 2 else "devices"
    return (
        f"{k - 1} {noun}: best attempt overflows {miss.device_id} by {describe_bytes(miss.overflow_bytes)} "
        f"(needs {describe_bytes(miss.budget_bytes + miss.overflow_bytes)}, budget {describe_bytes(miss.budget_bytes)})",
        f"more than {k} devices: not used; each extra stage adds a handoff",
    )
