"""StatusReport: the body of ``GET /v1/stagewise/status`` — the placement (read once) and the live counters.

Cheap by construction: the placement view is built once per loaded model (:class:`ModelFacts`); each
read then takes one :class:`MetricsSnapshot` of the engine's Prometheus series (which the engine
process sends on request, between steps, from its I/O thread). Nothing here locks out the engine's steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import Metric

from stagewise.engine.metrics_snapshot import snapshot_of
from stagewise.server.live_window import LiveWindow
from stagewise.server.server_state import ServerState


class StatusReport:
    """Builds status bodies for one server; call from the event loop only."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.window = LiveWindow()

    def body(self, engine_families: Iterable[Metric]) -> dict[str, Any]:
        """``phase`` always; ``placement`` and ``live`` (from ``engine_families``, the engine's series read
        just now) once a model is loaded (None before)."""
        state = self.state
        model, engine = state.model, state.engine
        out: dict[str, Any] = {"object": "stagewise.status", "phase": state.phase,
                               "model": state.served_names(model).name if model is not None else None,
                               "placement": None, "live": None}
        if model is None or engine is None:
            return out
        stages = model.stages
        snap = snapshot_of(engine_families, stages)
        rates = self.window.add(snap)
        out["placement"] = model.placement
        out["live"] = {
            "time_s": snap.time_s,  # the server's monotonic clock
            "running": snap.running, "waiting": snap.waiting, "sequence_slots": model.slots,
            "requests_total": snap.requests_total, "prompt_tokens_total": snap.prompt_tokens_total,
            "prefill_tokens_total": snap.prefill_tokens_total,
            "generation_tokens_total": snap.generation_tokens_total, "preemptions_total": snap.preemptions_total,
            **{k: rates[k] for k in ("interval_s", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s")},
            "stages": [{"index": k, "kv_blocks_in_use": snap.kv_blocks_in_use[k], "kv_blocks": snap.kv_blocks[k],
                        "state_bytes_in_use": snap.state_bytes_in_use[k], "steps_total": snap.stage_step[k].count,
                        "step_s": rates["stage_step_s"][k], "steps_per_s": rates["stage_steps_per_s"][k]}
                       for k in range(stages)],
            "engine_process": engine.process_info(),
            "handoffs": [{"boundary": f"{k}->{k + 1}", "handoffs_total": snap.handoff[k].count,
                          "handoff_s": rates["handoff_s"][k]} for k in range(stages - 1)],
        }
        return out
