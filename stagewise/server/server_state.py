"""ServerState: the server's phase (loading → warming_up → ready → draining; ready → restarting → ready when the
engine process dies) and what it serves once loaded."""

from __future__ import annotations

import threading
from typing import Any

from stagewise.engine.metrics import EngineMetrics
from stagewise.engine.scheduler import EngineClosed
from stagewise.errors import EngineDied, WorkerLost
from stagewise.server.engine_front import EngineFront
from stagewise.server.model_facts import ModelFacts
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.served_names import ServedNames


class ServerState:
    """Shared by the HTTP handlers, the loader thread and the signal handler (all transitions locked)."""

    def __init__(self, settings: ServeSettings, metrics: EngineMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or EngineMetrics()
        self.phase = "loading"
        self.model: ModelFacts | None = None
        self.engine: EngineFront | None = None
        self.load_error: BaseException | None = None
        self._lock = threading.Lock()

    def set_warming_up(self) -> bool:
        """``loading`` → ``warming_up`` (still 503); False if draining began meanwhile."""
        with self._lock:
            if self.phase != "loading":
                return False
            self.phase = "warming_up"
            return True

    def set_ready(self, engine: EngineFront) -> bool:
        """Publish the engine and its model (after loading, or a restart); False (and nothing published)
        if draining began meanwhile."""
        facts = engine.facts
        with self._lock:
            if self.phase not in ("loading", "warming_up", "restarting"):
                return False
            self.model, self.engine, self.phase = facts, engine, "ready"
            self.metrics.loaded.set(1)
            return True

    def set_restarting(self) -> bool:
        """``ready`` → ``restarting`` (503 ``engine_died``) when the engine process died; False while draining."""
        with self._lock:
            if self.phase != "ready":
                return False
            self.phase = "restarting"
            self.metrics.loaded.set(0)
            return True

    def set_failed(self, error: BaseException) -> None:
        with self._lock:
            self.load_error, self.phase = error, "failed"

    def begin_draining(self) -> bool:
        """Enter ``draining``; False if already draining (a second signal)."""
        with self._lock:
            if self.phase == "draining":
                return False
            self.phase = "draining"
            self.metrics.loaded.set(0)
            return True

    def worker_report(self) -> dict[str, Any] | None:
        """The pipeline's health (worker processes' liveness); None before the model is ready.

        The one source both ``/health`` and admission (:meth:`serving`) read, so they never disagree."""
        engine = self.engine
        return engine.worker_report() if engine is not None else None

    def serving(self) -> tuple[EngineFront, ModelFacts]:
        """The engine and model; :class:`EngineClosed` (503) while loading or draining, :class:`WorkerLost`
        (503) while :meth:`worker_report` says a worker is lost (what ``/health`` says too)."""
        with self._lock:
            ready = self.phase == "ready" and self.engine is not None and self.model is not None
            engine, model, phase = self.engine, self.model, self.phase
        if ready and engine is not None and model is not None:
            report = self.worker_report()
            if report is not None and report["status"] != "ok":
                raise WorkerLost(report["message"] or f"the pipeline is {report['status']}; retry later")
            return engine, model
        if phase == "restarting":
            raise EngineDied("the engine process died; a new one is loading the model: retry later")
        raise EngineClosed(f"the server is {phase}; retry later" if phase in ("loading", "warming_up")
                           else f"the server is {phase} and accepts no new requests")

    def served_names(self, model: ModelFacts) -> ServedNames:
        """The names ``model`` answers to here: ``--served-model-name``'s, else its own (the first is listed
        by ``/v1/models``, carried by responses and shown by the status endpoint)."""
        return ServedNames.of(model.name, self.settings.load.model, self.settings.served_model_names)
