"""EngineMetrics: the Prometheus series the server exports at ``/metrics``.

Each instance owns its registry, so several engines (tests) never collide.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest

if TYPE_CHECKING:  # NOTE: not at run time: the API process keeps its HTTP series here and imports no torch
    from stagewise.runtime.executor import Executor
    from stagewise.runtime.pipeline import StepTimings

SERVER_SERIES = frozenset({"stagewise_http_requests", "stagewise_status_seconds", "stagewise_model_loaded"})
"""The families the HTTP side keeps; every other one is the engine's (in the engine process when serving)."""

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_RATE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


class EngineMetrics:
    """Counters, gauges and histograms for requests, tokens, queue, latency, stages and memory."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter("stagewise_http_requests", "HTTP requests by endpoint and status",
                                     ["endpoint", "status"], registry=r)
        self.requests = Counter("stagewise_requests", "Engine requests finished, by finish reason",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("stagewise_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("stagewise_generation_tokens", "Tokens generated", registry=r)
        self.prefill_tokens = Counter("stagewise_prefill_tokens",
                                      "Prompt tokens run through prefill steps (recomputed ones again)", registry=r)
        self.queue_depth = Gauge("stagewise_queue_depth", "Requests waiting in the queue", registry=r)
        self.active_sequences = Gauge("stagewise_active_sequences", "Requests running on the pipeline", registry=r)
        self.state_slots_in_use = Gauge("stagewise_state_slots_in_use",
                                        "Sequence state slots holding a live sequence", registry=r)
        self.stage_state_in_use = Gauge("stagewise_stage_state_bytes_in_use",
                                        "KV / recurrent state bytes of each stage held by live sequences",
                                        ["stage", "device"], registry=r)
        self.preemptions = Counter("stagewise_preemptions", "Sequences preempted for KV blocks (recomputed later)",
                                   registry=r)
        self.stage_kv_blocks_in_use = Gauge("stagewise_stage_kv_blocks_in_use",
                                            "KV cache blocks of each stage's pool held by live sequences",
                                            ["stage", "device"], registry=r)
        self.stage_kv_blocks = Gauge("stagewise_stage_kv_blocks", "KV cache blocks in each stage's pool",
                                     ["stage", "device"], registry=r)
        self.prefix_hit_tokens = Counter("stagewise_prefix_cache_hit_tokens",
                                         "Prompt tokens served from the prefix cache (not prefilled)", registry=r)
        self.prefix_queries = Counter("stagewise_prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache (every start, restarts too)", registry=r)
        self.stage_prefix_blocks = Gauge("stagewise_stage_prefix_cache_blocks",
                                         "KV blocks of each stage's pool holding a cached prefix (in use or idle)",
                                         ["stage", "device"], registry=r)
        self.ttft = Histogram("stagewise_time_to_first_token_seconds", "Submit to first token, seconds",
                              buckets=_LATENCY_BUCKETS_S, registry=r)
        self.decode_rate = Histogram("stagewise_decode_tokens_per_second", "Decode rate per request, tokens/s",
                                     buckets=_RATE_BUCKETS, registry=r)
        self.stage_step = Histogram("stagewise_stage_step_seconds", "Compute time of one stage in one step",
                                    ["stage", "device"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.handoff = Histogram("stagewise_handoff_seconds", "Handoff time across one stage boundary",
                                 ["boundary"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.memory_charge = Gauge("stagewise_device_memory_charge_bytes", "Bytes charged in each stage's ledger",
                                   ["stage", "device", "category"], registry=r)
        self.status_seconds = Counter("stagewise_status_seconds",
                                      "Time spent building GET /v1/stagewise/status bodies, on the event loop",
                                      registry=r)
        self.loaded = Gauge("stagewise_model_loaded", "1 once the model is loaded and serving", registry=r)

    def observe_step(self, pipeline: Executor, timings: StepTimings) -> None:
        for k, seconds in enumerate(timings.stage_s):
            self.stage_step.labels(str(k), pipeline.stages[k].spec.device).observe(seconds)
        for k, seconds in enumerate(timings.handoff_s):
            self.handoff.labels(f"{k}->{k + 1}").observe(seconds)

    def observe_rows(self, pipeline: Executor, rows: int, kv_blocks: int | None = None) -> None:
        """``rows`` sequence slots (and ``kv_blocks`` KV blocks, when the batcher assigns them) hold live
        sequences: the slots gauge and each stage's state bytes in use (KV pools by the blocks in use,
        recurrent state by the rows)."""
        self.state_slots_in_use.set(rows)
        slots = max(pipeline.rows, 1)
        for k, stage in enumerate(pipeline.stages):
            table = stage.block_table if kv_blocks is not None else None
            if table is None or not stage.states:
                nbytes = stage.ledger.charged.get("state", 0) * rows // slots
            else:
                from stagewise.models.kv_cache import KVCache  # the engine's side only (torch; see the imports)

                pooled = sum(s.nbytes for s in stage.states.values() if isinstance(s, KVCache))
                per_row = sum(s.nbytes for s in stage.states.values() if not isinstance(s, KVCache))
                nbytes = pooled * (kv_blocks or 0) // table.pool_blocks + per_row * rows // slots
            self.stage_state_in_use.labels(str(k), stage.spec.device).set(nbytes)

    def observe_prefix_cache(self, pipeline: Executor, hit_tokens: int, queried_tokens: int, cached_blocks: int) -> None:
        """``hit_tokens`` of ``queried_tokens`` more were served from the prefix cache; ``cached_blocks``
        hold a keyed prefix now (the same block ids on every stage: each stage's gauge reads the same)."""
        self.prefix_hit_tokens.inc(hit_tokens)
        self.prefix_queries.inc(queried_tokens)
        for k, stage in enumerate(pipeline.stages):
            self.stage_prefix_blocks.labels(str(k), stage.spec.device).set(cached_blocks)

    def observe_blocks(self, pipeline: Executor, used_blocks: int, preempted: int) -> None:
        """``used_blocks`` of the pool (the same ids on every stage) hold live sequences; ``preempted``
        more sequences were preempted since the last call."""
        pool = pipeline.kv_pool
        if pool is None:
            return
        if preempted:
            self.preemptions.inc(preempted)
        for k, stage in enumerate(pipeline.stages):
            self.stage_kv_blocks.labels(str(k), stage.spec.device).set(pool.blocks)
            self.stage_kv_blocks_in_use.labels(str(k), stage.spec.device).set(used_blocks)

    def observe_memory(self, pipeline: Executor) -> None:
        for k, stage in enumerate(pipeline.stages):
            for category, nbytes in stage.ledger.charged.items():
                self.memory_charge.labels(str(k), stage.spec.device, category).set(nbytes)

    def render(self, engine_families: Iterable[Metric] | None = None) -> bytes:
        """The text exposition format; with ``engine_families`` (another registry's, e.g. the engine
        process's), those stand for this registry's engine series (all but :data:`SERVER_SERIES`)."""
        if engine_families is None:
            return generate_latest(self.registry)
        return generate_latest(_Merged(self.registry, list(engine_families)))

    def engine_families(self) -> list[Metric]:
        """This registry's engine series (all but :data:`SERVER_SERIES`), as collected now."""
        return [family for family in self.registry.collect() if family.name not in SERVER_SERIES]


class _Merged:
    """A collector of ``server``'s own series plus ``engine`` families (``generate_latest`` only calls collect)."""

    def __init__(self, server: CollectorRegistry, engine: list[Metric]) -> None:
        self.server, self.engine = server, engine

    def collect(self) -> Iterator[Metric]:
        yield from (family for family in self.server.collect() if family.name in SERVER_SERIES)
        yield from self.engine
