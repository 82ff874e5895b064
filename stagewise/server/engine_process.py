"""EngineProcess: the API process's side of the engine process — spawn it, talk to it, notice its death.

Two ZeroMQ sockets on IPC paths this process binds (so a restarted engine process connects to the same
ones): PUSH for :data:`~stagewise.server.engine_messages.ToEngine` messages, PULL for what the engine
sends back. A receiving thread decodes each message and hands it on (outputs to their request's sink,
replies to the awaiting coroutine); a watching thread waits on the process's exit and then fails every
request it carried with :class:`EngineDied` at once (503 in OpenAI's shape) and calls ``on_death``. A
serving process that sends nothing for ``--step-timeout-s`` (its loop says :class:`Alive` every second
when it has nothing else to say) is hung: the watching thread kills it, and its exit is a death as any.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

import zmq
from prometheus_client import Metric

from stagewise.engine.request import EngineRequest
from stagewise.engine.request_handle import OutputSink
from stagewise.errors import EngineDied, EngineMessageRejected, StagewiseError
from stagewise.server import engine_messages as m
from stagewise.server.client_socket import hung_up
from stagewise.server.message_codec import error_of, from_engine_codec
from stagewise.server.message_records import facts_of, families_of, output_of, submit_of
from stagewise.server.model_facts import ModelFacts
from stagewise.server.remote_handle import RemoteHandle
from stagewise.server.serve_settings import ServeSettings

_POLL_MS = 100
_HANG_CHECK_S = 0.5  # how often the watching thread looks at when the engine process was last heard
_QUERY_TIMEOUT_S = 10.0
_ANSWER_GRACE_S = 1.0  # a process that exited while loading: how long its last message may take to arrive
_EXIT_TIMEOUT_S = 30.0  # after its drain, the engine process closes the model and exits  # a bound on a hung engine process's metrics reply
_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _engine_main(settings: ServeSettings, to_engine: str, from_engine: str) -> None:
    """The spawned process's target: the engine core, imported there only (the API process imports no torch;
    a spawn target is pickled by name, which imports its module here)."""
    from stagewise.server.engine_core import run_engine_process

    run_engine_process(settings, to_engine, from_engine)


def _resolve(waiter: _Waiter, value: Any, error: BaseException | None = None) -> None:
    loop, future = waiter

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    loop.call_soon_threadsafe(settle)


class EngineProcess:
    """The engine in a process of its own (see the module docstring); an :class:`EngineFront`.

    ``on_phase`` hears ``warming_up``; ``on_death`` is called (from the watching thread) when a
    process that was serving exits."""

    def __init__(self, settings: ServeSettings, on_phase: Callable[[str], None] | None = None) -> None:
        self.settings, self.on_phase = settings, on_phase
        self.on_death: Callable[[EngineDied], None] | None = None
        self._dir = tempfile.mkdtemp(prefix="stagewise-engine-")
        self._to_engine, self._from_engine = f"ipc://{self._dir}/to-engine", f"ipc://{self._dir}/from-engine"
        self._context = zmq.Context()
        self._out, self._in = self._context.socket(zmq.PUSH), self._context.socket(zmq.PULL)
        for sock in (self._out, self._in):
            sock.setsockopt(zmq.LINGER, 0)
        self._out.bind(self._to_engine)
        self._in.bind(self._from_engine)
        self._codec = from_engine_codec()
        self._send_lock, self._lock = threading.Lock(), threading.Lock()
        self._keys = itertools.count()
        self._handles: dict[int, RemoteHandle] = {}
        self._admissions: dict[int, _Waiter] = {}
        self._queries: dict[int, _Waiter] = {}
        self._report: dict[str, Any] | None = None
        self._facts: ModelFacts | None = None
        self._ready = threading.Event()
        self._load_error: StagewiseError | None = None
        self._drained = threading.Event()
        self._clean = False
        self._exiting = False
        self._serving = False  # a Ready came from the current process
        self._closed = False
        self._heard_s = time.monotonic()  # when the engine process's last message arrived
        self._hung_s: float | None = None  # how long the process was silent when it was stopped as hung
        self.process: BaseProcess | None = None
        self.pid: int | None = None
        self.alive = False
        self.restarts = 0
        self._receiver = threading.Thread(target=self._receive, name="stagewise-engine-receiver", daemon=True)
        self._receiver.start()

    # ----- lifetime ------------------------------------------------------------------------------
    def start(self) -> ModelFacts:
        """Spawn the engine process and wait until it serves; raises its load error (``DoesNotFit``, ...)."""
        self._ready.clear()
        self._load_error = None
        self._hung_s = None
        self._exiting = self._serving = False
        process = multiprocessing.get_context("spawn").Process(
            target=_engine_main, args=(self.settings, self._to_engine, self._from_engine),
            name="stagewise-engine", daemon=False)
        process.start()
        self.process = process
        threading.Thread(target=self._watch, args=(process,), name="stagewise-engine-watcher", daemon=True).start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        assert self._facts is not None
        return self._facts

    def restart(self) -> ModelFacts:
        """A fresh engine process after the last one died (its requests failed already)."""
        self.restarts += 1
        return self.start()

    @property
    def facts(self) -> ModelFacts:
        if self._facts is None:
            raise EngineDied("the engine process has not loaded the model")
        return self._facts

    def drain(self, grace_s: float) -> bool:
        if self.alive:
            self._send(m.Drain(grace_s))
            self._drained.wait()  # set by Drained, or by the process's exit
        return self._clean

    def cancel_all(self) -> None:
        if self.alive:
            self._send(m.Drain(0.0))  # a drain under way: the engine cancels everything at once

    def stop(self) -> None:
        """Drain at once if still serving, let the process close the model and exit, close the sockets."""
        process = self.process
        if process is not None and process.is_alive():
            self.drain(0.0)
            with self._lock:
                self._exiting = True  # its exit is no death
            try:
                self._send(m.Exit())
            except EngineDied:
                pass  # it reads nothing more (a failed load: it is leaving on its own): wait for it, as below
            process.join(_EXIT_TIMEOUT_S)
            if process.is_alive():  # hung past its drain: it frees nothing more by waiting
                print(f"stagewise: the engine process (pid {process.pid}) did not exit; killing it", file=sys.stderr)
                process.kill()
                process.join()
        self._closed = True
        self._receiver.join()  # within one poll: then no thread uses the sockets
        self._out.close()
        self._in.close()
        self._context.term()
        shutil.rmtree(self._dir, ignore_errors=True)

    # ----- requests ------------------------------------------------------------------------------
    async def submit(self, request: EngineRequest, sink: OutputSink, client_fd: int | None = None) -> RemoteHandle:
        loop = asyncio.get_running_loop()
        admitted: asyncio.Future[None] = loop.create_future()
        handle = RemoteHandle(next(self._keys), request, sink, self._cancel, client_fd)
        with self._lock:
            if not self.alive:
                raise EngineDied("the engine process is not running; retry later")
            self._handles[handle.key] = handle
            self._admissions[handle.key] = (loop, admitted)
        try:
            self._send(submit_of(handle.key, request))
            await admitted
        except BaseException:
            with self._lock:
                self._handles.pop(handle.key, None)
                self._admissions.pop(handle.key, None)
            raise
        return handle

    def _cancel(self, key: int) -> None:
        if self.alive:  # else the watcher ends the request
            self._send(m.Cancel(key))

    def fail_next_step(self, stage: int) -> None:
        self._send(m.FailNextStep(stage))

    def set_step_delay(self, delay_s: float) -> None:
        self._send(m.StepDelay(delay_s))

    def worker_report(self) -> dict[str, Any] | None:
        return self._report

    def process_info(self) -> dict[str, int] | None:
        return {"pid": self.pid, "restarts": self.restarts} if self.pid is not None else None

    async def engine_families(self) -> list[Metric]:
        """The engine process's series; none while no engine process serves (they are its to report)."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[tuple[m.FamilyRecord, ...]] = loop.create_future()
        with self._lock:
            if not self.alive:
                return []
            query = next(self._keys)
            self._queries[query] = (loop, reply)
        try:
            self._send(m.MetricsQuery(query))
            return families_of(await asyncio.wait_for(reply, _QUERY_TIMEOUT_S))
        finally:
            with self._lock:
                self._queries.pop(query, None)

    def _send(self, message: m.ToEngine) -> None:
        with self._send_lock:
            try:
                self._out.send(self._codec.encode(message), zmq.NOBLOCK)
            except zmq.Again as exc:  # its queue is full: the engine process reads nothing
                raise EngineDied("the engine process is not reading its messages; retry later") from exc

    # ----- the receiving and watching threads ---------------------------------------------------
    def _receive(self) -> None:
        while not self._closed:
            if not self._in.poll(_POLL_MS):
                continue
            data = self._in.recv()
            self._heard_s = time.monotonic()
            try:
                self._apply(self._codec.decode(data))
            except EngineMessageRejected as exc:
                print(f"stagewise: dropped a message from the engine process: {exc}", file=sys.stderr)
            except Exception:  # a bug (a sink whose loop closed, ...): logged; the other requests go on
                traceback.print_exc(file=sys.stderr)

    def _apply(self, message: m.ToEngine | m.FromEngine) -> None:
        if isinstance(message, m.StepOutputs):
            outputs = [(record.key, output_of(record)) for record in message.outputs]  # all checked first
            watched: dict[int, list[RemoteHandle]] = {}  # client socket -> the running requests it receives
            for key, output in outputs:
                with self._lock:
                    handle = self._handles.get(key)
                    if handle is not None and output.finished:
                        del self._handles[key]
                if handle is not None:
                    handle.deliver(output)
                    if not output.finished and handle.client_fd is not None:
                        watched.setdefault(handle.client_fd, []).append(handle)
            for fd in hung_up(watched) if watched else ():
                for handle in watched[fd]:
                    handle.cancel()  # the client left: the engine stops at its next step, not the event loop's
        elif isinstance(message, m.Admitted):
            error = error_of(message.error) if message.error is not None else None
            with self._lock:
                waiter = self._admissions.pop(message.key, None)
                if error is not None:
                    self._handles.pop(message.key, None)
            if waiter is not None:
                _resolve(waiter, None, error)
        elif isinstance(message, m.MetricsReply):
            with self._lock:
                waiter = self._queries.pop(message.query_id, None)
            if waiter is not None:
                _resolve(waiter, message.families)
        elif isinstance(message, m.Health):
            self._report = json.loads(message.report_json) if message.report_json is not None else None
        elif isinstance(message, m.Ready):
            self._facts, self.pid = facts_of(message.model), message.pid
            self._drained.clear()
            with self._lock:
                self.alive = self._serving = True
            self._ready.set()
        elif isinstance(message, m.LoadFailed):
            self._load_error = error_of(message.error)
            self._ready.set()
        elif isinstance(message, m.Phase):
            if self.on_phase is not None:
                self.on_phase(message.phase)
        elif isinstance(message, m.Alive):
            pass  # heard (above): the loop turns
        elif isinstance(message, m.Drained):
            self._clean = message.clean
            with self._lock:
                self.alive = False  # it takes no more requests
            self._drained.set()
        else:
            raise EngineMessageRejected(f"the engine process sent a {type(message).__name__}, which only it may get")

    def _watch(self, process: BaseProcess) -> None:
        timeout_s = self.settings.step_timeout_s
        while not wait([process.sentinel], _HANG_CHECK_S):
            silent_s = time.monotonic() - self._heard_s
            if self._serving and not self._exiting and silent_s > timeout_s and self._hung_s is None:
                self._hung_s = silent_s
                print(f"stagewise: the engine process (pid {process.pid}) sent nothing for {silent_s:.0f} s "
                      f"(--step-timeout-s {timeout_s:g}): a step that does not end; stopping it", file=sys.stderr)
                process.kill()
        how = f"was stopped after {self._hung_s:.0f} s without progress (--step-timeout-s)" if self._hung_s is not None \
            else f"exited with code {process.exitcode}"
        error = EngineDied(f"the engine process (pid {process.pid}) {how}; the requests it carried failed, and a "
                           "new one is loading the model: retry later")
        with self._lock:
            died, self.alive = self._serving and not self._exiting, False
            handles, self._handles = list(self._handles.values()), {}
            waiters = [*self._admissions.values(), *self._queries.values()]
            self._admissions, self._queries = {}, {}
        for waiter in waiters:
            _resolve(waiter, None, error)
        for handle in handles:
            handle.fail(error)
        self._report = None
        self._drained.set()
        # a process that failed to load sends LoadFailed and leaves: its message may still be on its way
        if not self._ready.wait(_ANSWER_GRACE_S):
            self._load_error = self._load_error or error
            self._ready.set()
        if died and self.on_death is not None:
            self.on_death(error)
