"""Turn a search result into a CertifiedPlacement (charges re-derived by ``stage_charge``)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

from stagewise.errors import PlacementError
from stagewise.hardware.sizes import format_bytes
from stagewise.placement.certified_placement import CertifiedPlacement, CertifiedStage, fingerprint
from stagewise.placement.cost_model import PS_PER_S, pipelined_prefill_s_per_token, stage_prefill_s_per_token
from stagewise.placement.prediction import Prediction
from stagewise.placement.search import Found, Miss, Searcher
from stagewise.placement.stage_placement import StagePlacement
from stagewise.spec.charge import stage_charge


def certify(searcher: Searcher, found: Found, objective: str, reasons: tuple[str, ...]) -> CertifiedPlacement:
    spec, profile, topology = searcher.spec, searcher.profile, searcher.topology
    bounds = [0, *found.cuts, spec.num_blocks]
    k = len(found.order)
    stages = []
    stage_ps: list[int] = []
    prefill_stage_s: list[float] = []
    for j, device_id in enumerate(found.order):
        sp = StagePlacement(device_id, bounds[j], bounds[j + 1], entry=j == 0, exit=j == k - 1)
        charge = stage_charge(spec, profile, sp.start, sp.end, sp.entry, sp.exit)
        device = topology.device(device_id)
        if charge.total_bytes > device.budget_bytes:  # NOTE: the search and the accounting disagree: a bug
            raise PlacementError(f"internal: stage {j} on {device_id} over budget after search")
        stages.append(CertifiedStage(sp, charge, device.budget_bytes, device.torch_device))
        stage_ps.append(searcher.costs[device_id].cost(sp.start, sp.end, sp.entry, sp.exit))
        prefill_stage_s.append(stage_prefill_s_per_token(spec, profile, device, sp.start, sp.end, sp.exit))
    hand_ps = list(found.handoffs_ps)
    decode_s = (sum(stage_ps) + sum(hand_ps)) / PS_PER_S
    slowest_s = max(s + h for s, h in zip(stage_ps, hand_ps, strict=True)) / PS_PER_S
    prefill_hand_s = 0.0
    for a, b in pairwise(found.order):
        link = topology.link(a, b)
        prefill_hand_s += link.transfer_s(profile.chunk_tokens * spec.handoff_bytes_per_token(profile))
    prefill_s = pipelined_prefill_s_per_token(prefill_stage_s, prefill_hand_s / profile.chunk_tokens / profile.batch,
                                              chunks=-(-profile.context_tokens // profile.chunk_tokens))
    predicted = Prediction(
        decode_roofline_tokens_per_s=profile.batch / decode_s,
        prefill_roofline_tokens_per_s=1.0 / prefill_s,
        pipelined_roofline_tokens_per_s=profile.batch / slowest_s,
        handoff_s_per_token=sum(hand_ps) / PS_PER_S / profile.batch,
    )
    placements = tuple(s.placement for s in stages)
    return CertifiedPlacement(
        outcome="fits_single" if k == 1 else "fits_across",
        stages=tuple(stages),
        predicted=predicted,
        objective=objective,
        profile=profile,
        model_name=spec.name,
        fingerprint=fingerprint(spec, topology, profile, objective, placements),
        reasons=reasons,
        exhaustive=searcher.exhaustive,
    )


def does_not_fit(searcher: Searcher, objective: str, k_max: int, n_dev: int) -> CertifiedPlacement:
    """A ``does_not_fit`` certificate: the least-overflowing attempt with ``k_max`` devices,
    why fewer / more fail, and the longest context that would fit."""
    spec, topology, profile = searcher.spec, searcher.topology, searcher.profile
    miss = searcher.miss(k_max)
    noun = "device" if k_max == 1 else "devices"
    reasons = [
        f"{spec.name} does not fit: with {k_max} {noun} the best attempt needs "
        f"{format_bytes(miss.budget_bytes + miss.overflow_bytes)} on {miss.device_id}, "
        f"budget {format_bytes(miss.budget_bytes)} (short by {format_bytes(miss.overflow_bytes)})"
    ]
    if k_max > 1:
        one = searcher.miss(1)
        reasons.append(
            f"1 device: needs {format_bytes(one.budget_bytes + one.overflow_bytes)}, "
            f"largest budget {format_bytes(one.budget_bytes)} ({one.device_id})"
        )
    exhaustive = searcher.exhaustive  # probing more devices below must not change the certificate's flag
    if k_max < n_dev:
        # no order was fixed (a fixed one never reaches here): the searcher already holds every device
        fits_more = any(searcher.feasible(k) for k in range(k_max + 1, min(n_dev, spec.num_blocks) + 1))
        reasons.append(f"more devices: {'would fit' if fits_more else 'would not fit either'} beyond --max-stages {k_max}")
    else:
        reasons.append(f"more devices: none left ({n_dev} listed)")
    return CertifiedPlacement(
        outcome="does_not_fit",
        stages=(),
        predicted=None,
        objective=objective,
        profile=profile,
        model_name=spec.name,
        fingerprint=fingerprint(spec, topology, profile, objective, ()),
        reasons=tuple(reasons),
        limiting_device=miss.device_id,
        required_bytes=miss.budget_bytes + miss.overflow_bytes,
        budget_bytes=miss.budget_bytes,
        deficit_bytes=miss.overflow_bytes,
        longest_context_tokens=_longest_context(searcher, k_max),
        exhaustive=exhaustive,
        attempt=_attempt(searcher, miss),
        attempt_devices=k_max,
    )


def _attempt(searcher: Searcher, miss: Miss) -> tuple[CertifiedStage, ...]:
    """The stages of the attempt ``miss`` describes, each charged by :func:`stage_charge`."""
    spec, profile, topology = searcher.spec, searcher.profile, searcher.topology
    k = len(miss.order)
    out = []
    for j, (device_id, (a, b)) in enumerate(zip(miss.order, miss.ranges, strict=False)):
        sp = StagePlacement(device_id, a, b, entry=j == 0, exit=j == k - 1)
        device = topology.device(device_id)
        out.append(CertifiedStage(sp, stage_charge(spec, profile, a, b, sp.entry, sp.exit), device.budget_bytes,
                                  device.torch_device))
    return tuple(out)


def _longest_context(searcher: Searcher, k_max: int) -> int | None:
    """Largest context below the profile's that fits with at most ``k_max`` devices (bisection;
    fitting only gets harder as the context grows)."""

    def fits(context: int) -> bool:
        s = searcher.with_profile(replace(searcher.profile, context_tokens=context))
        return any(s.feasible(k) for k in range(1, k_max + 1))

    lo, hi = 0, searcher.profile.context_tokens - 1  # invariant: lo fits (0 = none), answer <= hi
    if hi < 1 or not fits(1):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
