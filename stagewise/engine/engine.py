"""Engine: admits requests, runs them on the pipeline from one worker thread, reports outputs.

Loop: ``schedule() → execute() → update()``. ``execute`` runs one request through the
:class:`Generator`, detokenizes incrementally, matches stop strings and delivers
:class:`RequestOutput` s to the request's handle. A failed step fails only its request.
"""

from __future__ import annotations

import threading
import time

from stagewise.engine.generator import Generator
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.metrics import EngineMetrics
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink, RequestHandle
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.scheduler import Batch, Scheduler
from stagewise.engine.sequence_output import SequenceOutput
from stagewise.engine.step_guard import StepGuard
from stagewise.engine.warm_up import WarmUp, warm_up
from stagewise.errors import RequestError, StagewiseError, StepCancelled, StepFailed

_POLL_S = 0.05


class Engine:
    """Serves one :class:`LoadedModel`. Thread-safe :meth:`submit`; one worker executes.

    Args:
        model: the loaded model (the engine does not close it; the owner does).
        max_waiting: queue bound; :meth:`submit` raises ``QueueFull`` past it.
        metrics: where to report; a fresh :class:`EngineMetrics` if None.
        prefill_chunk: prompt tokens per prefill step.
    """

    def __init__(self, model: LoadedModel, max_waiting: int = 16, metrics: EngineMetrics | None = None,
                 prefill_chunk: int = 512) -> None:
        if model.tokenizer is None:
            raise RequestError(f"model {model.name} has no tokenizer; the engine needs one to serve text")
        self.model = model
        self.tokenizer = model.tokenizer
        self.metrics = metrics or EngineMetrics()
        self.scheduler = Scheduler(max_waiting)
        self.generator = Generator(model.pipeline, model.max_context, prefill_chunk)
        self.guard = StepGuard()
        model.pipeline.fault_hook = self.guard
        self.stop_token_ids = model.stop_token_ids
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._loop, name="stagewise-engine", daemon=True)
        self.metrics.observe_memory(model.pipeline)

    def warm_up(self) -> WarmUp:
        """Before :meth:`start`: compile kernels and capture graphs with synthetic requests (see
        :mod:`stagewise.engine.warm_up`); not counted in the metrics."""
        if self._worker.is_alive():
            raise RuntimeError("warm up before the engine starts")
        return warm_up(self.generator, self.model.config.vocab_size)

    # ----- client side -------------------------------------------------------------------------
    def start(self) -> Engine:
        self._worker.start()
        return self

    def submit(self, request: EngineRequest, sink: OutputSink) -> RequestHandle:
        """Queue ``request``; outputs go to ``sink`` from the worker thread.

        Raises ContextLengthExceeded / RequestError (checked now), QueueFull, EngineClosed.
        """
        self.generator.check(request.generation())
        handle = RequestHandle(request, sink)
        self.scheduler.add(handle)
        self.metrics.queue_depth.set(self.scheduler.waiting)
        return handle

    def drain(self, grace_s: float) -> bool:
        """Refuse new requests, let queued and running ones finish for up to ``grace_s``, then cancel
        the rest and stop the worker. Returns True when everything finished within the grace."""
        self.scheduler.close()
        deadline = time.monotonic() + grace_s
        while not self.scheduler.idle() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        clean = self.scheduler.idle()
        self.stop()  # cancels what still runs
        return clean

    def stop(self) -> None:
        """Stop the worker after the current step (cancelling what still runs)."""
        self.scheduler.close()
        self.scheduler.cancel_all()
        self._stop.set()
        if self._worker.is_alive() and threading.current_thread() is not self._worker:
            self._worker.join()

    # ----- worker side -------------------------------------------------------------------------
    def _loop(self) -> None:
        while not (self._stop.is_set() and self.scheduler.idle()):
            batch = self.scheduler.schedule(_POLL_S)
            for handle in batch.dropped:
                self._finish(handle, RequestOutput("", handle.request.prompt_tokens, 0, finish_reason="cancelled"))
            self.metrics.queue_depth.set(self.scheduler.waiting)
            if batch.run:
                self.execute(batch)
                self.update(batch)

    def execute(self, batch: Batch) -> None:
        """Run every request of ``batch`` to completion (one at a time, slot 0)."""
        for handle in batch.run:
            self.metrics.active_sequences.set(self.scheduler.running)
            self.metrics.state_slots_in_use.set(1)
            self.metrics.prompt_tokens.inc(handle.request.prompt_tokens)
            try:
                self._run_one(handle)
            finally:
                # the slot is free: the next sequence resets it when it starts (Generator.stream)
                self.metrics.state_slots_in_use.set(0)

    def update(self, batch: Batch) -> None:
        self.scheduler.update(batch)
        self.metrics.active_sequences.set(self.scheduler.running)
        self.metrics.queue_depth.set(self.scheduler.waiting)

    def _run_one(self, handle: RequestHandle) -> None:
        request = handle.request
        out = SequenceOutput(request, self.tokenizer)
        pipeline = self.model.pipeline
        try:
            for event in self.generator.stream(request.generation(), cancel=handle.is_cancelled):
                if out.completion_tokens == 0:
                    handle.first_token_s = time.monotonic()
                    self.metrics.ttft.observe(handle.first_token_s - handle.submitted_s)
                self.metrics.observe_step(pipeline, pipeline.last_timings)
                self.metrics.generation_tokens.inc()
                output = out.add(event)
                if output.finished:
                    self._finish(handle, output)
                    return
                if output.text or output.logprobs:
                    handle.deliver(output)
                if handle.is_cancelled():
                    raise StepCancelled("cancelled by the client")
        except StepCancelled:
            self._finish(handle, out.end("cancelled"))
        except StagewiseError as exc:
            self._finish(handle, out.end("error", exc))
        except Exception as exc:  # a bug in sampling/decoding must fail the request, not the server
            error = StepFailed(f"request {request.request_id} failed: {type(exc).__name__}: {exc}")
            self._finish(handle, out.end("error", error))

    def _finish(self, handle: RequestHandle, output: RequestOutput) -> None:
        assert output.finish_reason is not None
        self.metrics.requests.labels(output.finish_reason).inc()
        if handle.first_token_s is not None and output.completion_tokens > 1:
            decode_s = time.monotonic() - handle.first_token_s
            if decode_s > 0:
                self.metrics.decode_rate.observe((output.completion_tokens - 1) / decode_s)
        handle.deliver(output)
