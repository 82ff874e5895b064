"""verify: an independent check of a CertifiedPlacement against its inputs.

It shares nothing with the search: it re-derives every charge with ``stage_charge`` (a direct
sum over the stage's blocks), compares it with the certificate, checks each stage against its
own device's budget, and recomputes the fingerprint.
"""

from __future__ import annotations

from stagewise.errors import PlacementError
from stagewise.hardware.topology import Topology
from stagewise.placement.certified_placement import CertifiedPlacement, fingerprint
from stagewise.placement.stage_placement import check_stages
from stagewise.spec.charge import stage_charge
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile


def verify(placement: CertifiedPlacement, spec: ModelSpec, topology: Topology, profile: Profile) -> None:
    """Raise :class:`PlacementError` unless ``placement`` is legal and certified for exactly
    these inputs: contiguous stages on distinct known devices, each charge equal to
    ``stage_charge`` and within that device's budget, and a matching fingerprint."""
    if placement.profile != profile:
        raise PlacementError("certificate was made for a different profile")
    expected = fingerprint(spec, topology, profile, placement.objective, placement.placements)
    if expected != placement.fingerprint:
        raise PlacementError("certificate fingerprint does not match its inputs (spec, topology, profile or stages)")
    if not placement.fits:
        return
    check_stages(placement.placements, spec.num_blocks)
    if (placement.outcome == "fits_single") != (len(placement.stages) == 1):
        raise PlacementError(f"outcome {placement.outcome} with {len(placement.stages)} stages")
    for i, stage in enumerate(placement.stages):
        sp = stage.placement
        device = topology.device(sp.device_id)
        charge = stage_charge(spec, profile, sp.start, sp.end, sp.entry, sp.exit)
        if charge != stage.charge:
            raise PlacementError(f"stage {i} on {sp.device_id}: certified charge {stage.charge} != derived {charge}")
        if stage.budget_bytes != device.budget_bytes:
            raise PlacementError(f"stage {i}: certified budget {stage.budget_bytes} != device budget {device.budget_bytes}")
        if charge.total_bytes > device.budget_bytes:
            raise PlacementError(
                f"stage {i} on {sp.device_id}: charge {charge.total_bytes} bytes exceeds budget {device.budget_bytes}"
            )
        if sp.shard.is_sharded:
            raise PlacementError(f"stage {i}: sharded stages cannot be certified yet")
