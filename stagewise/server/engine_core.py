"""EngineCore: the engine process — loads the model, runs the :class:`Engine`, talks to the API process.

One thread: the engine's loop and the ZeroMQ sockets take turns, so no step waits for another thread
to hand back the interpreter lock. Each turn applies the API's messages that arrived (submit, cancel,
metrics query, fault injection, drain; without waiting while the engine has work, blocking on the
inbox while it has none), runs one engine turn (schedule → execute, as in-process), and sends what the
turn produced (its metrics recorded) as one :class:`StepOutputs`.

Detokenization, stop strings and grammar matching stay here, next to sampling: a grammar's matcher
state must advance with every sampled token and masks the next draw; a stop string ends a request,
and ending it here frees its sequence slot and KV blocks at the step that found it, with the finish
reason, token counts and request log exactly as in-process (the API would learn of it a message
later and the engine would run tokens for nobody). The API process tokenizes, renders templates and
compiles grammars (validating them before a response starts); the engine recompiles the grammar's
definition over its own tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

import zmq

from stagewise.console import console as make_console
from stagewise.engine.engine import Engine
from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.heap_freeze import freeze_heap
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_with_progress
from stagewise.engine.request_handle import RequestHandle
from stagewise.engine.request_log import print_requests
from stagewise.engine.request_output import RequestOutput
from stagewise.engine.warm_up import needs_warm_up
from stagewise.errors import EngineDied, EngineMessageRejected, GrammarError, StagewiseError
from stagewise.kernels.kernel_env import kernels_mode, pdl_enabled
from stagewise.server import engine_messages as m
from stagewise.server.load_display import placement_lines
from stagewise.server.message_codec import error_record, to_engine_codec
from stagewise.server.message_records import family_records, model_record, output_record, request_of
from stagewise.server.model_facts import ModelFacts
from stagewise.server.random_tokenizer import with_demo_tokenizer
from stagewise.server.serve_settings import ServeSettings

_POLL_MS = 100  # an idle loop looks at the parent process at least this often
_HEALTH_EVERY_S = 0.1  # and at the workers' health at most this often (not on every step)
ALIVE_EVERY_S = 1.0  # with nothing else sent for this long, the loop says it is alive (the API's hang check)


def run_engine_process(settings: ServeSettings, to_engine: str, from_engine: str) -> None:
    """The engine process's entry (spawned): load, serve messages until drained or orphaned, close."""
    # NOTE: Ctrl-C reaches the whole process group, and a service manager's SIGTERM often the whole cgroup: the
    # API process drains on either and tells this one what to do (its own death: noticed by the parent check)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    print_requests()
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    for sock in (inbox, outbox):
        sock.setsockopt(zmq.LINGER, 2000)
    inbox.connect(to_engine)
    outbox.connect(from_engine)
    codec = to_engine_codec()
    model = _load(settings, lambda message: outbox.send(codec.encode(message)))
    if model is not None:
        try:
            EngineCore(settings, model, inbox, outbox).serve()
        finally:
            model.close()
    inbox.close()
    outbox.close()
    context.term()


def _load(settings: ServeSettings, send: Callable[[m.FromEngine], None]) -> LoadedModel | None:
    """The loaded model, or None after sending :class:`LoadFailed` (the typed error; a bug as EngineDied)."""
    try:
        kernels_mode()  # a bad STAGEWISE_KERNELS or STAGEWISE_PDL: the typed one-line error, before loading
        pdl_enabled()  # (the CLI checked them already; an engine process started otherwise checks here)
        load = settings.load if settings.prefix_cache else dataclasses.replace(settings.load, prefix_snapshots=0)
        model = load_with_progress(load)
        if model.tokenizer is None and (settings.load.model or "").startswith("random:"):
            model = with_demo_tokenizer(model)  # random weights come without a tokenizer
        return model
    except StagewiseError as exc:
        send(m.LoadFailed(error_record(exc)))
    except BaseException as exc:  # a bug: its traceback on stderr, a typed error for the API process
        traceback.print_exc(file=sys.stderr)
        send(m.LoadFailed(error_record(EngineDied(f"the engine process failed loading: {type(exc).__name__}: {exc}"))))
    return None


class EngineCore:
    """Runs one loaded model's engine behind the sockets (see the module docstring)."""

    def __init__(self, settings: ServeSettings, model: LoadedModel, inbox: zmq.Socket[bytes],
                 outbox: zmq.Socket[bytes]) -> None:
        self.settings, self.model = settings, model
        self.inbox, self.outbox = inbox, outbox
        self.codec = to_engine_codec()
        self.handles: dict[int, RequestHandle] = {}  # by the API's key
        self.pending: list[m.OutputRecord] = []  # outputs delivered during the engine's current turn
        self.parent = os.getppid()
        self.health: str | None = None
        self.health_read_s = 0.0
        self.sent_s = time.monotonic()  # when a message last went to the API process
        self.exit = False
        self.engine: Engine | None = None

    def send(self, message: m.FromEngine) -> None:
        self.outbox.send(self.codec.encode(message))
        self.sent_s = time.monotonic()

    def serve(self) -> None:
        try:
            engine = self._start()
        except StagewiseError as exc:
            self.send(m.LoadFailed(error_record(exc)))
            return
        while not (self.exit and not engine.busy):
            if self.inbox.poll(0 if engine.busy or self.exit else _POLL_MS):
                while self.inbox.poll(0):
                    self.apply(self.inbox.recv())
            engine.turn(0.0)
            self._flush()
            clean = engine.end_drain()  # after every output of the turn
            if clean is not None:
                self.send(m.Drained(clean))
            self._report_health()
            if time.monotonic() - self.sent_s >= ALIVE_EVERY_S:
                self.send(m.Alive())
            if os.getppid() != self.parent:  # the API process is gone: nobody to serve (or to send to)
                engine.stop()
                return

    def _start(self) -> Engine:
        model, settings = self.model, self.settings
        console = make_console()
        engine = Engine(model, settings.queue, prefix_cache=settings.prefix_cache)
        pool = model.pipeline.kv_pool
        pool_text = f", a KV pool of {pool.tokens} positions (--kv-tokens)" if pool is not None else ""
        console.print(f"stagewise: up to {engine.batcher.slots} sequences at once, "
                      f"{model.max_context:,} positions each (--max-seqs, --context){pool_text}", highlight=False)
        if settings.warm_up and needs_warm_up(model):
            self.send(m.Phase("warming_up"))
            console.print("stagewise: warming up (compiling kernels, capturing CUDA graphs)…")
            done = engine.warm_up(full_context=settings.peak_check)
            console.print(f"stagewise: {done.summary()}", highlight=False)
        self.engine = engine
        if model.tokenizer is not None and model.stop_token_ids:
            try:  # built now (~1 s for 150k tokens, once), not by the first structured request, between two steps
                self._vocabulary()
            except GrammarError:
                pass  # a tokenizer llguidance cannot read: each structured request is refused with the error
        freeze_heap()  # loaded and warmed: what lives from now on is not walked by every full collection
        for line in placement_lines(model):
            console.print(line, highlight=False, soft_wrap=True)
        self.send(m.Ready(model_record(ModelFacts.of(model, engine.batcher.slots)), os.getpid()))
        self._report_health()
        return engine

    def apply(self, data: bytes) -> None:
        """Decode and apply one message from the API process; a malformed one is dropped (logged), unapplied."""
        engine = self.engine
        assert engine is not None
        try:
            message = self.codec.decode(data)
        except EngineMessageRejected as exc:
            print(f"stagewise engine: {exc}", file=sys.stderr)
            return
        if isinstance(message, m.Submit):
            self._submit(engine, message)
        elif isinstance(message, m.Cancel):
            handle = self.handles.get(message.key)
            if handle is not None:  # else finished already: its end is on its way
                handle.cancel()
        elif isinstance(message, m.MetricsQuery):
            engine.metrics.observe_memory(self.model.pipeline)
            self.send(m.MetricsReply(message.query_id, family_records(engine.metrics.engine_families())))
        elif isinstance(message, m.FailNextStep):
            if 0 <= message.stage < len(self.model.pipeline.stages):
                engine.guard.fail_next_step(message.stage)
        elif isinstance(message, m.StepDelay):
            engine.guard.delay_s = message.delay_s
        elif isinstance(message, m.Exit):
            engine.stop()  # cancels what runs; the loop turns until it has finished
            self.exit = True
        elif isinstance(message, m.Drain):
            engine.begin_drain(message.grace_s)  # a second one: cancel at once

    def _submit(self, engine: Engine, submit: m.Submit) -> None:
        key = submit.key
        try:
            request = request_of(submit, self._vocabulary() if submit.sampling.grammar is not None else None)
            self.handles[key] = engine.submit(request, lambda output: self._deliver(key, output))
        except StagewiseError as exc:
            self.send(m.Admitted(key, error_record(exc)))
            return
        self.send(m.Admitted(key, None))

    def _vocabulary(self) -> GrammarVocabulary:
        model = self.model
        if model.tokenizer is None:
            raise GrammarError(f"model {model.name} has no tokenizer to constrain")
        return GrammarVocabulary.of(model.tokenizer, model.config.vocab_size, model.stop_token_ids)

    def _deliver(self, key: int, output: RequestOutput) -> None:  # during the engine's turn
        self.pending.append(output_record(key, output))

    def _flush(self) -> None:
        """Send the outputs of the turn that ended: never part of a turn, so a client that has its last
        token also finds that step in the metrics."""
        if self.pending:
            ready, self.pending = self.pending, []
            for record in ready:
                if record.finish_reason is not None:
                    self.handles.pop(record.key, None)
            self.send(m.StepOutputs(tuple(ready)))

    def _report_health(self) -> None:
        now = time.monotonic()
        if now - self.health_read_s < _HEALTH_EVERY_S:
            return
        self.health_read_s = now
        report = getattr(self.model.pipeline, "health", None)
        text = json.dumps(report()) if report is not None else None
        if text != self.health:
            self.health = text
            self.send(m.Health(text))
