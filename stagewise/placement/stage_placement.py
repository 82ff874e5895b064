"""StagePlacement: one stage — a device and a half-open block range, with entry / exit."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stagewise.errors import PlacementError
from stagewise.placement.shard import Shard


@dataclass(frozen=True)
class StagePlacement:
    """Blocks ``[start, end)`` on ``device_id``; ``entry`` owns the embedding, ``exit`` the head."""

    device_id: str
    start: int
    end: int
    entry: bool
    exit: bool
    shard: Shard = field(default_factory=Shard)

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise PlacementError(f"stage on {self.device_id}: blocks [{self.start}, {self.end}) must be non-empty")

    @property
    def num_blocks(self) -> int:
        return self.end - self.start


def check_stages(stages: tuple[StagePlacement, ...] | list[StagePlacement], num_blocks: int) -> None:
    """Raise :class:`PlacementError` unless ``stages`` cover ``[0, num_blocks)`` contiguously,
    in order, on distinct devices, with entry on the first stage and exit on the last only."""
    if not stages:
        raise PlacementError("placement has no stages")
    position = 0
    seen: set[str] = set()
    for i, s in enumerate(stages):
        if s.start != position:
            raise PlacementError(f"stage {i} starts at block {s.start}, expected {position}")
        if s.device_id in seen:
            raise PlacementError(f"stage {i}: device {s.device_id} already holds a stage")
        if s.entry != (i == 0) or s.exit != (i == len(stages) - 1):
            raise PlacementError(f"stage {i}: entry must be on the first stage and exit on the last")
        seen.add(s.device_id)
        position = s.end
    if position != num_blocks:
        raise PlacementError(f"stages cover blocks [0, {position}) but the model has {num_blocks}")


def stage_to_dict(s: StagePlacement) -> dict[str, Any]:
    out: dict[str, Any] = {"device": s.device_id, "blocks": [s.start, s.end], "entry": s.entry, "exit": s.exit}
    if s.shard.is_sharded:
        out["shard"] = s.shard.to_dict()
    return out
