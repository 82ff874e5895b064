"""StatusReport: the body of ``GET /v1/stagewise/status`` — the placement (read once) and the live counters.

Cheap by construction: the placement view is built once per loaded model; each read then takes one
:class:`MetricsSnapshot` (reads of the Prometheus series the engine already updates) and a few
gauges the scheduler keeps. Nothing here waits for, or locks out, the engine's thread.
"""

from __future__ import annotations

from typing import Any

from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.metrics_snapshot import snapshot_of
from stagewise.server.live_window import LiveWindow
from stagewise.server.placement_view import placement_view
from stagewise.server.server_state import ServerState


class StatusReport:
    """Builds status bodies for one server; call from the event loop only."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.window = LiveWindow()
        self._placement: tuple[LoadedModel, dict[str, Any]] | None = None

    def placement(self, model: LoadedModel) -> dict[str, Any]:
        if self._placement is None or self._placement[0] is not model:
            self._placement = (model, placement_view(model))
        return self._placement[1]

    def body(self) -> dict[str, Any]:
        """``phase`` always; ``placement`` and ``live`` once a model is loaded (None before)."""
        state = self.state
        model, engine = state.model, state.engine
        out: dict[str, Any] = {"object": "stagewise.status", "phase": state.phase,
                               "model": state.served_names(model).name if model is not None else None,
                               "placement": None, "live": None}
        if model is None or engine is None:
            return out
        stages = len(model.pipeline.stages)
        snap = snapshot_of(state.metrics, stages)
        rates = self.window.add(snap)
        out["placement"] = self.placement(model)
        out["live"] = {
            "time_s": snap.time_s,  # the server's monotonic clock
            "running": snap.running, "waiting": snap.waiting, "sequence_slots": engine.batcher.slots,
            "requests_total": snap.requests_total, "prompt_tokens_total": snap.prompt_tokens_total,
            "prefill_tokens_total": snap.prefill_tokens_total,
            "generation_tokens_total": snap.generation_tokens_total, "preemptions_total": snap.preemptions_total,
            **{k: rates[k] for k in ("interval_s", "prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s")},
            "stages": [{"index": k, "kv_blocks_in_use": snap.kv_blocks_in_use[k], "kv_blocks": snap.kv_blocks[k],
                        "state_bytes_in_use": snap.state_bytes_in_use[k], "steps_total": snap.stage_step[k].count,
                        "step_s": rates["stage_step_s"][k], "steps_per_s": rates["stage_steps_per_s"][k]}
                       for k in range(stages)],
            "handoffs": [{"boundary": f"{k}->{k + 1}", "handoffs_total": snap.handoff[k].count,
                          "handoff_s": rates["handoff_s"][k]} for k in range(stages - 1)],
        }
        return out
