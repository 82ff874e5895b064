"""Charge: the bytes one stage needs on its device, and ``stage_charge`` that computes it.

This is the one function the planner, ``verify``, assessment and the runtime's post-load
check all call. ``reserve_bytes`` is allocator slack: 1% of state + workspace (block rounding and
fragmentation of the caching allocator: the allocations made and freed while serving), rounded up.
Weights are allocated once, tensor by tensor, before anything is freed; what the allocator's
segments round them up to is the device's own reserve (``--reserve``), outside the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagewise.errors import ConfigError
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.state_bytes import block_state_bytes
from stagewise.spec.workspace_bytes import stage_workspace_bytes

RESERVE_PERCENT = 1


@dataclass(frozen=True)
class Charge:
    """Bytes a stage needs: ``total_bytes`` = weights + state + workspace + reserve."""

    weights_bytes: int
    state_bytes: int
    workspace_bytes: int
    reserve_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.state_bytes + self.workspace_bytes + self.reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_bytes": self.weights_bytes,
            "state_bytes": self.state_bytes,
            "workspace_bytes": self.workspace_bytes,
            "reserve_bytes": self.reserve_bytes,
            "total_bytes": self.total_bytes,
        }


def reserve_for(weights_bytes: int, state_bytes: int, workspace_bytes: int) -> int:
    """Allocator slack of a stage: ``RESERVE_PERCENT`` of what is allocated while serving (state and
    workspace), rounded up; ``weights_bytes`` is not part of it (allocated once, see the module note)."""
    del weights_bytes
    return -(-(state_bytes + workspace_bytes) * RESERVE_PERCENT // 100)  # ceil


def stage_charge(spec: ModelSpec, profile: Profile, start: int, end: int, entry: bool, exit: bool) -> Charge:
    """Charge of a stage holding blocks ``[start, end)`` (+ entry / exit when it owns them).

    ``start == end`` is allowed only for a stage that owns entry or exit alone.
    """
    if not 0 <= start <= end <= spec.num_blocks or (start == end and not (entry or exit)):
        raise ConfigError(f"stage blocks [{start}, {end}) are not a range of {spec.num_blocks} blocks")
    blocks = spec.blocks[start:end]
    weights = sum(b.weight_bytes for b in blocks) + spec.stage_table_bytes  # every stage keeps its tables
    if entry:
        weights += spec.entry.weight_bytes
    if exit:
        weights += spec.exit.weight_bytes - (spec.exit.shared_bytes if entry else 0)
    state = sum(block_state_bytes(b, profile) for b in blocks)
    workspace = stage_workspace_bytes(spec, profile, list(blocks), entry, exit)
    return Charge(weights, state, workspace, reserve_for(weights, state, workspace))
