"""assess: the fit outcome of a model on some devices (the same object ``plan`` returns)."""

from __future__ import annotations

from stagewise.hardware.topology import Topology
from stagewise.placement.certified_placement import CertifiedPlacement
from stagewise.placement.planner import plan
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile


def assess(
    spec: ModelSpec, topology: Topology, profile: Profile | None = None, objective: str = "latency"
) -> CertifiedPlacement:
    """``fits_single`` (one device), ``fits_across`` (fewest devices, stage summary) or
    ``does_not_fit`` (limiting device, required vs budget, deficit, longest fitting context).
    Never raises for a model that does not fit; ``require_fit()`` does."""
    return plan(spec, topology, profile, objective=objective)
