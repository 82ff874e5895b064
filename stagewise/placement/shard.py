"""Shard: tensor / expert parallel degrees within one stage (representable, not executed yet)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagewise.errors import PlacementError

MAX_DEGREE = 64


@dataclass(frozen=True)
class Shard:
    """``tensor_degree`` devices split each matrix; ``expert_degree`` devices split the experts.

    Degree 1 / 1 is an unsharded stage, the only kind the planner produces unless asked and the
    only kind the executor runs today.
    """

    tensor_degree: int = 1
    expert_degree: int = 1

    def __post_init__(self) -> None:
        for name in ("tensor_degree", "expert_degree"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEGREE:
                raise PlacementError(f"shard: {name} must be an integer in 1..{MAX_DEGREE}, got {value!r}")
            if value & (value - 1):
                raise PlacementError(f"shard: {name} must be a power of two, got {value}")

    @property
    def is_sharded(self) -> bool:
        return self.tensor_degree > 1 or self.expert_degree > 1

    def check_divides(self, num_heads: int, num_kv_heads: int, num_experts: int) -> None:
        """Raise :class:`PlacementError` unless the degrees divide the model's heads / experts."""
        if num_heads % self.tensor_degree or num_kv_heads % self.tensor_degree:
            raise PlacementError(
                f"shard: tensor_degree {self.tensor_degree} does not divide {num_heads} heads / {num_kv_heads} kv heads"
            )
        if self.expert_degree > 1 and (num_experts == 0 or num_experts % self.expert_degree):
            raise PlacementError(f"shard: expert_degree {self.expert_degree} does not divide {num_experts} experts")

    def to_dict(self) -> dict[str, Any]:
        return {"tensor_degree": self.tensor_degree, "expert_degree": self.expert_degree}
