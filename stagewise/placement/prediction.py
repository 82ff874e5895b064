"""Prediction: tokens per second a placement should reach, from bandwidth, FLOPs and links.

Both figures come from the cost model, which already counts what real kernels reach (decode:
bytes, FLOPs and per-kernel launch time; prefill: GEMM efficiency and the host's issue rate),
calibrated on an H200; the ranges are ±15 % (decode) and ±20 % (prefill) around them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagewise.errors import PlacementError

EFFICIENCY_LOW, EFFICIENCY_MID, EFFICIENCY_HIGH = 0.80, 1.0, 1.20  # prefill
DECODE_LOW, DECODE_MID, DECODE_HIGH = 0.85, 1.0, 1.15


@dataclass(frozen=True)
class Prediction:
    """Roofline decode / prefill rates of a placement (single request, sequential stages),
    the pipelined decode rate set by the slowest stage, and the handoff cost per token."""

    decode_roofline_tokens_per_s: float
    prefill_roofline_tokens_per_s: float
    pipelined_roofline_tokens_per_s: float
    handoff_s_per_token: float

    def __post_init__(self) -> None:
        for name in ("decode_roofline_tokens_per_s", "prefill_roofline_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise PlacementError(f"prediction: {name} must be positive")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_roofline_tokens_per_s * DECODE_MID

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_roofline_tokens_per_s * EFFICIENCY_MID

    @property
    def decode_range(self) -> tuple[float, float]:
        r = self.decode_roofline_tokens_per_s
        return (r * DECODE_LOW, r * DECODE_HIGH)

    @property
    def prefill_range(self) -> tuple[float, float]:
        r = self.prefill_roofline_tokens_per_s
        return (r * EFFICIENCY_LOW, r * EFFICIENCY_HIGH)

    def to_dict(self) -> dict[str, Any]:
        return {
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 3),
            "handoff_s_per_token": self.handoff_s_per_token,
            "decode_tokens_per_s_range": [round(v, 3) for v in self.decode_range],
            "prefill_tokens_per_s_range": [round(v, 3) for v in self.prefill_range],
            "pipelined_decode_tokens_per_s": round(self.pipelined_roofline_tokens_per_s * DECODE_MID, 3),
        }
