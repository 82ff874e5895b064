"""LiveWindow: rates (tokens/s, mean step and handoff times) over the last second of snapshots.

Each status read adds a :class:`MetricsSnapshot`; the rates compare it with the newest earlier
snapshot at least ``window_s`` old (or the oldest kept), so any number of pages polling at any
pace see the same figures. Only the event loop's thread calls it (no lock).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from stagewise.engine.metrics_snapshot import MetricsSnapshot

WINDOW_S = 1.0
_MIN_INTERVAL_S = 0.05  # closer snapshots than this give no rates (noise, not a measurement)


class LiveWindow:
    """Snapshots of the last ``window_s`` (and the one just before), and the rates between them."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._kept: deque[MetricsSnapshot] = deque()

    def add(self, now: MetricsSnapshot) -> dict[str, Any]:
        """Keep ``now``; the rates from the base snapshot to it (JSON-ready; rates None without a base)."""
        base = None
        while self._kept and now.time_s - self._kept[0].time_s >= self.window_s:
            base = self._kept.popleft()  # the newest of those at least window_s old ends up as base
        if base is not None:
            self._kept.appendleft(base)  # still the base of the next read until a newer one is old enough
        elif self._kept:
            base = self._kept[0]
        self._kept.append(now)
        return _rates(base, now)


def _rates(base: MetricsSnapshot | None, now: MetricsSnapshot) -> dict[str, Any]:
    interval_s = now.time_s - base.time_s if base is not None else 0.0
    if base is None or interval_s < _MIN_INTERVAL_S:
        return {"interval_s": None, "prefill_tokens_per_s": None, "decode_tokens_per_s": None, "ttft_s": None,
                "stage_step_s": [None] * len(now.stage_step), "stage_steps_per_s": [None] * len(now.stage_step),
                "handoff_s": [None] * len(now.handoff)}
    return {
        "interval_s": interval_s,
        "prefill_tokens_per_s": (now.prefill_tokens_total - base.prefill_tokens_total) / interval_s,
        "decode_tokens_per_s": (now.generation_tokens_total - base.generation_tokens_total) / interval_s,
        "ttft_s": now.ttft.mean_since(base.ttft),
        "stage_step_s": [t.mean_since(b) for t, b in zip(now.stage_step, base.stage_step, strict=True)],
        "stage_steps_per_s": [(t.count - b.count) / interval_s
                              for t, b in zip(now.stage_step, base.stage_step, strict=True)],
        "handoff_s": [t.mean_since(b) for t, b in zip(now.handoff, base.handoff, strict=True)],
    }
