"""Engine: admits requests, runs them on the pipeline from one worker thread, reports outputs.

Loop: ``schedule() → execute() → update()``. ``schedule`` admits waiting requests while sequence
slots are free; ``execute`` is one :class:`Batcher` iteration (a decode step for every running
sequence, a prefill chunk of a new one); token events are detokenized incrementally, stop strings
matched and :class:`RequestOutput` s delivered to each request's handle; ``update`` frees the slots
of finished requests. A failed step fails only the requests it carried.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from stagewise.engine.batcher import Batcher
from stagewise.engine.drain import Drain
from stagewise.engine.generation_request import TokenEvent
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.metrics import EngineMetrics
from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink, RequestHandle
from stagewise.engine.request_log import log_request
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.scheduler import Batch, Scheduler
from stagewise.engine.sequence import Sequence
from stagewise.engine.sequence_output import SequenceOutput
from stagewise.engine.step_guard import StepGuard
from stagewise.engine.warm_up import WarmUp, full_context_step, warm_up
from stagewise.errors import RequestError, StagewiseError, StepCancelled, StepFailed
from stagewise.runtime.peak_memory import PeakMeter

_POLL_S = 0.05


class Engine:
    """Serves one :class:`LoadedModel`. Thread-safe :meth:`submit`; one worker executes.

    Args:
        model: the loaded model (the engine does not close it; the owner does).
        max_waiting: requests that may wait for a sequence slot (beyond those a free slot takes at
            once); :meth:`submit` raises ``QueueFull`` past it.
        metrics: where to report; a fresh :class:`EngineMetrics` if None.
        micro_batches: decode groups in flight (default: the pipeline's ``max_in_flight``).
        prefix_cache: share cached prompt prefixes' KV blocks (``--no-prefix-cache``: off).

    The engine runs as many sequences at once as the pipeline has sequence slots (the profile's
    sequences); more requests wait in the queue. Steps prefill up to the profile's prefill chunk.
    """

    def __init__(self, model: LoadedModel, max_waiting: int = 16, metrics: EngineMetrics | None = None,
                 micro_batches: int | None = None, prefix_cache: bool = True) -> None:
        if model.tokenizer is None:
            raise RequestError(f"model {model.name} has no tokenizer; the engine needs one to serve text")
        self.model = model
        self.tokenizer = model.tokenizer
        self.metrics = metrics or EngineMetrics()
        self.batcher = Batcher(model.pipeline, model.max_context, model.prefill_chunk, micro_batches,
                               prefix_cache=prefix_cache)
        self.scheduler = Scheduler(max_waiting, max_running=self.batcher.slots)
        self.guard = StepGuard()
        model.pipeline.fault_hook = self.guard
        self.stop_token_ids = model.stop_token_ids
        self._stop = threading.Event()
        self._drain: Drain | None = None  # set by the first begin_drain
        self._worker = threading.Thread(target=self._loop, name="stagewise-engine", daemon=True)
        self.metrics.observe_memory(model.pipeline)
        self._preemptions = 0  # the batcher's count already reported
        self._prefill_tokens = 0  # the batcher's count already reported
        self._prefix = (0, 0)  # the batcher's prefix-cache (hit, queried) tokens already reported
        self.metrics.observe_blocks(model.pipeline, 0, 0)
        self._timings_seen = model.pipeline.last_timings  # the step timings already observed
        self.batcher.on_report = self._observe

    def warm_up(self, full_context: bool = True) -> WarmUp:
        """Before :meth:`start`: compile kernels and capture graphs with synthetic requests (see
        :mod:`stagewise.engine.warm_up`), then (``full_context``) a step at the largest prefill chunk and
        the full context; the CUDA devices' peak over both (the graphs' idle pool blocks counted once they
        are captured) is the load check's measured workspace (``model.peaks``). Not counted in the metrics."""
        if self._worker.is_alive():
            raise RuntimeError("warm up before the engine starts")
        meter = PeakMeter(stage.spec.torch_device for stage in self.model.pipeline.stages)
        meter.start()
        self.batcher.on_report = None
        try:
            done = warm_up(self.batcher, self.model.config.vocab_size)
            meter.checkpoint()  # the graphs are captured: their pools' idle blocks count from here
            if full_context:
                done = dataclasses.replace(done, full_context_tokens=full_context_step(self.batcher,
                                                                                       self.model.config.vocab_size))
        finally:
            self.batcher.on_report = self._observe
        self.model.peaks = meter.read()
        self._timings_seen = self.model.pipeline.last_timings
        self._prefill_tokens = self.batcher.prefill_tokens  # the warm-up's prompts are not the clients'
        self._prefix = (self.batcher.kv.hit_tokens, self.batcher.kv.queried_tokens)
        return done

    # ----- client side -------------------------------------------------------------------------
    def start(self) -> Engine:
        self._worker.start()
        return self

    def submit(self, request: EngineRequest, sink: OutputSink) -> RequestHandle:
        """Queue ``request``; outputs go to ``sink`` from the worker thread.

        Raises ContextLengthExceeded / RequestError (checked now), QueueFull, EngineClosed.
        """
        self.batcher.check(request.generation())
        handle = RequestHandle(request, sink)
        self.scheduler.add(handle)
        self.metrics.queue_depth.set(self.scheduler.waiting)
        return handle

    def begin_drain(self, grace_s: float) -> None:
        """Refuse new requests from now on; queued and running ones may finish for ``grace_s``, then are
        cancelled (by :meth:`end_drain`, at a turn). A second call cancels them at the next turn."""
        self.scheduler.close()
        if self._drain is None:
            self._drain = Drain(grace_s)
        else:
            self._drain.hurry()

    def end_drain(self) -> bool | None:
        """After each :meth:`turn`, by the thread that takes them: a drain under way cancels what still runs
        once its deadline has passed. Returns, the first time a drain is done (nothing waits or runs), whether
        everything finished within the grace; else None (no drain, or not done, or done before)."""
        drain = self._drain
        return drain.turn(self.busy, self.scheduler.cancel_all) if drain is not None else None

    def drain(self, grace_s: float) -> bool:
        """:meth:`begin_drain`, wait until it is done, then stop the worker. Returns True when everything
        finished within the grace. Blocks; with no worker running, this thread takes the turns."""
        self.begin_drain(grace_s)
        drain = self._drain
        assert drain is not None
        while not drain.wait(_POLL_S):
            if not self._worker.is_alive():  # never started, or stopped: nothing else turns
                self.turn(_POLL_S)
                self.end_drain()
        self.stop()
        return drain.clean

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
            self.turn(_POLL_S)
            self.end_drain()

    @property
    def busy(self) -> bool:
        """Sequences run, or requests wait or await their cancellation: the next :meth:`turn` has work."""
        return self.batcher.active > 0 or not self.scheduler.idle()

    def turn(self, timeout_s: float) -> None:
        """One turn of the loop: admit waiting requests while slots are free (waiting up to ``timeout_s``
        for one when nothing runs), then one :meth:`execute`. The worker thread calls it; an engine
        process that owns its sockets calls it from its own loop instead of :meth:`start`."""
        running = self.batcher.active > 0
        batch = self.scheduler.schedule(0.0 if running else timeout_s, self.batcher.free)
        for handle in batch.dropped:
            self._finish(handle, RequestOutput("", handle.request.prompt_tokens, 0, finish_reason="cancelled"))
        for handle in batch.run:
            self._admit(handle)
        self.metrics.queue_depth.set(self.scheduler.waiting)
        if self.batcher.active:
            self.execute()
        elif not batch.run:
            self.batcher.drain()

    def execute(self) -> None:
        """One batcher iteration: every running sequence advances by at most one token. The metrics
        are observed before the iteration's tokens reach their consumers (the batcher's ``on_report``):
        a client that holds its response reads counters that include the steps which made it."""
        try:
            self.batcher.iterate()
        except Exception as exc:  # a bug must fail the running requests, not the server
            self.batcher.fail_all(StepFailed(f"engine step failed: {type(exc).__name__}: {exc}"))
            self._observe()

    def _observe(self) -> None:
        """Bring the metrics up to the batcher's state; the step timings once per step settled since."""
        self.metrics.active_sequences.set(self.scheduler.running)
        kv_blocks = self.batcher.used_blocks if self.batcher.pool is not None else None
        self.metrics.observe_rows(self.model.pipeline, self.batcher.rows_in_use(), kv_blocks)
        preempted, self._preemptions = self.batcher.preemptions - self._preemptions, self.batcher.preemptions
        self.metrics.observe_blocks(self.model.pipeline, self.batcher.used_blocks, preempted)
        prefilled, self._prefill_tokens = self.batcher.prefill_tokens - self._prefill_tokens, self.batcher.prefill_tokens
        self.metrics.prefill_tokens.inc(prefilled)
        kv = self.batcher.kv
        hit, queried = kv.hit_tokens - self._prefix[0], kv.queried_tokens - self._prefix[1]
        self._prefix = (kv.hit_tokens, kv.queried_tokens)
        self.metrics.observe_prefix_cache(self.model.pipeline, hit, queried, kv.cached_blocks)
        timings = self.model.pipeline.last_timings
        if timings is not self._timings_seen:  # each settled step leaves a new record
            self._timings_seen = timings
            self.metrics.observe_step(self.model.pipeline, timings)

    def _admit(self, handle: RequestHandle) -> None:
        request = handle.request
        out = SequenceOutput(request, self.tokenizer)
        self.metrics.prompt_tokens.inc(request.prompt_tokens)

        def on_token(event: TokenEvent) -> bool:
            try:
                if out.completion_tokens == 0:
                    out.cached_tokens = seq.cached_tokens
                    handle.first_token_s = time.monotonic()
                    self.metrics.ttft.observe(handle.first_token_s - handle.submitted_s)
                self.metrics.generation_tokens.inc()
                output = out.add(event)
                if output.finished:
                    self._finish(handle, output)
                    return False
                if handle.is_cancelled():
                    self._finish(handle, out.end("cancelled"))
                    return False
                if output.text or output.logprobs:
                    handle.deliver(output)
                return True
            except Exception as exc:  # detokenizing or a client's sink: fail this request only
                error = StepFailed(f"request {request.request_id} failed: {type(exc).__name__}: {exc}")
                self._finish(handle, out.end("error", error))
                return False

        def on_error(error: StagewiseError) -> None:
            if isinstance(error, StepCancelled):
                self._finish(handle, out.end("cancelled"))
            else:
                self._finish(handle, out.end("error", error))

        seq = Sequence(request.generation(), on_token, on_error, handle.is_cancelled)
        try:
            self.batcher.add(seq)
        except StagewiseError as exc:
            self._finish(handle, out.end("error", exc))

    def update(self, batch: Batch) -> None:
        self.scheduler.update(batch)
        self.metrics.active_sequences.set(self.scheduler.running)
        self.metrics.queue_depth.set(self.scheduler.waiting)

    def _finish(self, handle: RequestHandle, output: RequestOutput) -> None:
        assert output.finish_reason is not None
        if handle.done:
            return
        self.metrics.requests.labels(output.finish_reason).inc()
        now = time.monotonic()
        decode_s = None
        if handle.first_token_s is not None and output.completion_tokens > 1:
            decode_s = now - handle.first_token_s
            if decode_s > 0:
                self.metrics.decode_rate.observe((output.completion_tokens - 1) / decode_s)
        ttft_s = handle.first_token_s - handle.submitted_s if handle.first_token_s is not None else None
        log_request(handle.request_id, output.prompt_tokens, output.completion_tokens, ttft_s, decode_s,
                    now - handle.submitted_s, output.finish_reason)  # before the client hears the end
        handle.deliver(output)
        self.scheduler.finish(handle)
        self.metrics.active_sequences.set(self.scheduler.running)
