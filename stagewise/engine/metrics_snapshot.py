"""MetricsSnapshot: the engine's live counters at one instant, read from :class:`~stagewise.engine.metrics.EngineMetrics`' families.

The same series ``/metrics`` exports, read back (no second bookkeeping): cumulative totals and
gauges, so two snapshots give rates over the time between them (:mod:`stagewise.server.live_window`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import Metric


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


def _values(families: dict[str, Metric], name: str, suffix: str = "") -> dict[str, float]:
    """The samples named ``<name><suffix>`` of family ``name``, by their first label's value ('' when unlabelled)."""
    out: dict[str, float] = {}
    family = families.get(name)
    for sample in family.samples if family is not None else ():
        if sample.name == name + suffix:
            out[next(iter(sample.labels.values()), "")] = sample.value
    return out


def _one(families: dict[str, Metric], name: str, suffix: str = "") -> float:
    return sum(_values(families, name, suffix).values())


def _per_index(values: dict[str, float], count: int) -> tuple[int, ...]:
    return tuple(int(values.get(str(k), 0)) for k in range(count))


def _timings(families: dict[str, Metric], name: str, keys: list[str]) -> tuple[Timing, ...]:
    sums, counts = _values(families, name, "_sum"), _values(families, name, "_count")
    return tuple(Timing(sums.get(key, 0.0), int(counts.get(key, 0))) for key in keys)


def snapshot_of(families: Iterable[Metric], stages: int) -> MetricsSnapshot:
    """The live series among ``families`` (an :class:`EngineMetrics` registry's ``collect()``, here or in the
    engine process) for a pipeline of ``stages`` stages. Reads only: the engine may move a counter between
    two reads, which a rate never notices; a family that is absent reads as zero."""
    f = {family.name: family for family in families}
    return MetricsSnapshot(
        time_s=time.monotonic(),
        running=int(_one(f, "stagewise_active_sequences")),
        waiting=int(_one(f, "stagewise_queue_depth")),
        requests_total=int(_one(f, "stagewise_requests", "_total")),
        prompt_tokens_total=int(_one(f, "stagewise_prompt_tokens", "_total")),
        prefill_tokens_total=int(_one(f, "stagewise_prefill_tokens", "_total")),
        generation_tokens_total=int(_one(f, "stagewise_generation_tokens", "_total")),
        preemptions_total=int(_one(f, "stagewise_preemptions", "_total")),
        ttft=Timing(_one(f, "stagewise_time_to_first_token_seconds", "_sum"),
                    int(_one(f, "stagewise_time_to_first_token_seconds", "_count"))),
        kv_blocks_in_use=_per_index(_values(f, "stagewise_stage_kv_blocks_in_use"), stages),
        kv_blocks=_per_index(_values(f, "stagewise_stage_kv_blocks"), stages),
        state_bytes_in_use=_per_index(_values(f, "stagewise_stage_state_bytes_in_use"), stages),
        stage_step=_timings(f, "stagewise_stage_step_seconds", [str(k) for k in range(stages)]),
        handoff=_timings(f, "stagewise_handoff_seconds", [f"{k}->{k + 1}" for k in range(stages - 1)]),
    )
