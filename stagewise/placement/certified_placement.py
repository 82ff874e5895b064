"""CertifiedPlacement: the planner's immutable answer, fingerprinted over its inputs.

Assessment, loading and execution all consume this object (design invariant 3); ``verify``
re-derives every charge from the spec, topology and profile it names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from stagewise.errors import DoesNotFit, PlacementError
from stagewise.hardware.topology import Topology
from stagewise.placement.prediction import Prediction
from stagewise.placement.stage_placement import StagePlacement, stage_to_dict
from stagewise.spec.charge import Charge
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

OUTCOMES = ("fits_single", "fits_across", "does_not_fit")


@dataclass(frozen=True)
class CertifiedStage:
    """A stage with its charge and its device's budget (and the torch device it runs on)."""

    placement: StagePlacement
    charge: Charge
    budget_bytes: int
    torch_device: str = ""

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.charge.total_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**stage_to_dict(self.placement), "charge": self.charge.to_dict(), "budget_bytes": self.budget_bytes}


@dataclass(frozen=True)
class CertifiedPlacement:
    """Outcome, stages (empty for ``does_not_fit``), prediction and a sha256 fingerprint.

    For ``does_not_fit``: ``limiting_device``, ``required_bytes`` vs its budget,
    ``deficit_bytes``, ``longest_context_tokens`` (None if no context fits), ``reasons`` and ``attempt``
    (the stages of the attempt the first reason describes, charged as a fitting stage would be).
    """

    outcome: str
    stages: tuple[CertifiedStage, ...]
    predicted: Prediction | None
    objective: str
    profile: Profile
    model_name: str
    fingerprint: str
    reasons: tuple[str, ...] = ()
    limiting_device: str = ""
    required_bytes: int = 0
    budget_bytes: int = 0
    deficit_bytes: int = 0
    longest_context_tokens: int | None = None
    exhaustive: bool = True
    attempt: tuple[CertifiedStage, ...] = ()  # does_not_fit: the best attempt's stages, the last one over budget
    attempt_devices: int = 0  # does_not_fit: the devices that attempt was made with

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise PlacementError(f"outcome {self.outcome!r} must be one of {OUTCOMES}")
        fits = self.outcome != "does_not_fit"
        if fits != bool(self.stages) or fits != (self.predicted is not None):
            raise PlacementError(f"{self.outcome}: stages and prediction must be present exactly when it fits")
        if fits and (self.outcome == "fits_single") != (len(self.stages) == 1):
            raise PlacementError(f"{self.outcome} with {len(self.stages)} stages")
        if not self.fingerprint.startswith("sha256:"):
            raise PlacementError("fingerprint must be 'sha256:<hex>'")

    @property
    def fits(self) -> bool:
        return self.outcome != "does_not_fit"

    @property
    def placements(self) -> tuple[StagePlacement, ...]:
        return tuple(s.placement for s in self.stages)

    def require_fit(self) -> CertifiedPlacement:
        """Self, or :class:`DoesNotFit` with the one-line reason."""
        if not self.fits:
            raise DoesNotFit(self.reasons[0] if self.reasons else f"{self.model_name} does not fit")
        return self

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "outcome": self.outcome,
            "model": self.model_name,
            "objective": self.objective,
            "profile": self.profile.to_dict(),
            "stages": [s.to_dict() for s in self.stages],
            "predicted": self.predicted.to_dict() if self.predicted else None,
            "fingerprint": self.fingerprint,
            "exhaustive": self.exhaustive,
            "reasons": list(self.reasons),
        }
        if not self.fits:
            out |= {
                "limiting_device": self.limiting_device,
                "required_bytes": self.required_bytes,
                "budget_bytes": self.budget_bytes,
                "deficit_bytes": self.deficit_bytes,
                "longest_context_tokens": self.longest_context_tokens,
                "attempt": [s.to_dict() for s in self.attempt],
                "attempt_devices": self.attempt_devices,
            }
        return out

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def fingerprint(
    spec: ModelSpec, topology: Topology, profile: Profile, objective: str, stages: tuple[StagePlacement, ...]
) -> str:
    """sha256 over the canonical JSON of the inputs (spec, devices and links, profile,
    objective) and the chosen stages. Independent of the order devices were listed in."""
    topo = topology.to_dict()
    topo.pop("name", None)
    payload = {
        "spec": spec.to_dict(),
        "topology": topo,
        "profile": profile.to_dict(),
        "objective": objective,
        "stages": [stage_to_dict(s) for s in stages],
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()
