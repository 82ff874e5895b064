"""MetricsSnapshot: the engine's live counters at one instant, read from :class:`EngineMetrics`.

The same series ``/metrics`` exports, read back (no second bookkeeping): cumulative totals and
gauges, so two snapshots give rates over the time between them (:mod:`stagewise.server.live_window`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from stagewise.engine.metrics import EngineMetrics


@dataclass(frozen=True)
class Timing:
    """A histogram's running ``sum_s`` over ``count`` observations."""

    sum_s: float
    count: int

    def mean_since(self, earlier: Timing) -> float | None:
        """Mean seconds of the observations made after ``earlier``; None when there were none."""
        count = self.count - earlier.count
        return (self.sum_s - earlier.sum_s) / count if count > 0 else None


@dataclass(frozen=True)
class MetricsSnapshot:
    """Counters (``*_total``, cumulative), gauges, and per-stage / per-boundary series (index order)."""

    time_s: float  # time.monotonic() when read
    running: int
    waiting: int
    requests_total: int
    prompt_tokens_total: int  # counted at admission
    prefill_tokens_total: int  # counted as prefill steps launch
    generation_tokens_total: int
    preemptions_total: int
    ttft: Timing
    kv_blocks_in_use: tuple[int, ...]  # per stage
    kv_blocks: tuple[int, ...]  # per stage (the pool)
    state_bytes_in_use: tuple[int, ...]  # per stage
    stage_step: tuple[Timing, ...]  # per stage
    handoff: tuple[Timing, ...]  # per boundary k -> k + 1


def _values(metric: Any, suffix: str = "") -> dict[str, float]:
    """``metric``'s samples named ``<name><suffix>``, by their first label's value ('' when unlabelled)."""
    out: dict[str, float] = {}
    for family in metric.collect():
        wanted = family.name + suffix
        for sample in family.samples:
            if sample.name == wanted:
                out[next(iter(sample.labels.values()), "")] = sample.value
    return out


def _one(metric: Any, suffix: str = "") -> float:
    return sum(_values(metric, suffix).values())


def _per_index(values: dict[str, float], count: int) -> tuple[int, ...]:
    return tuple(int(values.get(str(k), 0)) for k in range(count))


def _timings(metric: Any, keys: list[str]) -> tuple[Timing, ...]:
    sums, counts = _values(metric, "_sum"), _values(metric, "_count")
    return tuple(Timing(sums.get(key, 0.0), int(counts.get(key, 0))) for key in keys)


def snapshot_of(metrics: EngineMetrics, stages: int) -> MetricsSnapshot:
    """The live series of ``metrics`` for a pipeline of ``stages`` stages. Reads only (no lock is
    taken: the engine thread may move a counter between two reads, which a rate never notices)."""
    m = metrics
    return MetricsSnapshot(
        time_s=time.monotonic(),
        running=int(_one(m.active_sequences)),
        waiting=int(_one(m.queue_depth)),
        requests_total=int(_one(m.requests, "_total")),
        prompt_tokens_total=int(_one(m.prompt_tokens, "_total")),
        prefill_tokens_total=int(_one(m.prefill_tokens, "_total")),
        generation_tokens_total=int(_one(m.generation_tokens, "_total")),
        preemptions_total=int(_one(m.preemptions, "_total")),
        ttft=Timing(_one(m.ttft, "_sum"), int(_one(m.ttft, "_count"))),
        kv_blocks_in_use=_per_index(_values(m.stage_kv_blocks_in_use), stages),
        kv_blocks=_per_index(_values(m.stage_kv_blocks), stages),
        state_bytes_in_use=_per_index(_values(m.stage_state_in_use), stages),
        stage_step=_timings(m.stage_step, [str(k) for k in range(stages)]),
        handoff=_timings(m.handoff, [f"{k}->{k + 1}" for k in range(stages - 1)]),
    )
