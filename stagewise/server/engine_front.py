"""EngineFront: what the HTTP side asks of an engine, wherever it runs; LocalEngine, the in-process one.

``stagewise serve`` runs the engine in a process of its own (:class:`~stagewise.server.engine_process.EngineProcess`);
the in-process :class:`LocalEngine` serves tests that drive the app through a test client, and any
caller holding a loaded model and engine already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import Metric

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink
from stagewise.engine.request_output import RequestOutput
from stagewise.server.client_socket import hung_up
from stagewise.server.model_facts import ModelFacts

if TYPE_CHECKING:  # NOTE: not at run time: the API process, which holds an EngineProcess, imports no torch
    from stagewise.engine.engine import Engine
    from stagewise.engine.loaded_model import LoadedModel


class Handle(Protocol):
    """One submitted request, as its client holds it."""

    @property
    def request_id(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def cancel(self) -> None:
        """Ask the engine to end the request (any thread); its last output says ``cancelled``."""


class EngineFront(Protocol):
    @property
    def facts(self) -> ModelFacts: ...

    async def submit(self, request: EngineRequest, sink: OutputSink, client_fd: int | None = None) -> Handle:
        """Queue ``request`` (from the event loop); its outputs go to ``sink``, the last one finished.
        ``client_fd``: the HTTP client's socket; once it reports a hang-up after an output, the request is
        cancelled from the thread that delivered it (:mod:`~stagewise.server.client_socket`).
        Raises the refusal's typed error (``QueueFull``, ``ContextLengthExceeded``, ``EngineDied``, ...)."""

    def fail_next_step(self, stage: int) -> None: ...

    def set_step_delay(self, delay_s: float) -> None: ...

    def worker_report(self) -> dict[str, Any] | None:
        """The pipeline's worker processes' liveness (``/health``, admission); None without workers."""

    async def engine_families(self) -> list[Metric]:
        """The engine's Prometheus series, read now."""

    def drain(self, grace_s: float) -> bool:
        """Refuse new requests, let the rest finish within ``grace_s``, cancel what is left, stop; True if
        all finished. Blocks (call from a thread of its own)."""

    def cancel_all(self) -> None: ...

    def stop(self) -> None: ...

    def process_info(self) -> dict[str, int] | None:
        """``{"pid", "restarts"}`` of the engine's own process; None for an engine in this process."""


class LocalEngine:
    """An :class:`Engine` running in this process, behind the :class:`EngineFront` interface."""

    def __init__(self, model: LoadedModel, engine: Engine) -> None:
        self.model, self.engine = model, engine
        self._facts: ModelFacts | None = None

    @property
    def facts(self) -> ModelFacts:
        if self._facts is None:
            self._facts = ModelFacts.of(self.model, self.engine.batcher.slots)
        return self._facts

    async def submit(self, request: EngineRequest, sink: OutputSink, client_fd: int | None = None) -> Handle:
        if client_fd is None:
            return self.engine.submit(request, sink)
        handles: list[Handle] = []

        def deliver(output: RequestOutput) -> None:  # the engine's thread
            sink(output)
            if not output.finished and handles and hung_up((client_fd,)):
                handles[0].cancel()
        handles.append(self.engine.submit(request, deliver))
        return handles[0]

    def fail_next_step(self, stage: int) -> None:
        self.engine.guard.fail_next_step(stage)

    def set_step_delay(self, delay_s: float) -> None:
        self.engine.guard.delay_s = delay_s

    def worker_report(self) -> dict[str, Any] | None:
        report = getattr(self.model.pipeline, "health", None)
        return report() if report is not None else None

    async def engine_families(self) -> list[Metric]:
        self.engine.metrics.observe_memory(self.model.pipeline)
        return self.engine.metrics.engine_families()

    def drain(self, grace_s: float) -> bool:
        return self.engine.drain(grace_s)

    def cancel_all(self) -> None:
        self.engine.scheduler.cancel_all()

    def stop(self) -> None:
        self.engine.stop()

    def process_info(self) -> dict[str, int] | None:
        return None
