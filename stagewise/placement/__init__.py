"""stagewise.placement: the certified placement planner (no torch).

Public API::

    plan(spec, topology, profile, objective="latency", split=None, order=None,
         max_stages=None, stages=None) -> CertifiedPlacement
    assess(spec, topology, profile) -> CertifiedPlacement
    verify(placement, spec, topology, profile) -> None   # raises PlacementError
"""

from __future__ import annotations

from stagewise.placement.assessment import assess
from stagewise.placement.certified_placement import CertifiedPlacement, CertifiedStage
from stagewise.placement.planner import plan
from stagewise.placement.prediction import Prediction
from stagewise.placement.shard import Shard
from stagewise.placement.stage_placement import StagePlacement
from stagewise.placement.verify import verify

__all__ = [
    "CertifiedPlacement",
    "CertifiedStage",
    "Prediction",
    "Shard",
    "StagePlacement",
    "assess",
    "plan",
    "verify",
]
