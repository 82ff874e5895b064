"""Run the server: HTTP up first (``/health`` 503 while loading), the engine process loading meanwhile, drain
on signals, restart the engine process if it dies.

This process serves HTTP, tokenizes and streams; the engine runs in a process of its own
(:mod:`stagewise.server.engine_core`), so HTTP load does not share an interpreter lock with its steps.

SIGTERM/SIGINT: stop accepting (503), let in-flight and queued requests finish within
``grace_s``, cancel what is left, close the model (free the devices), exit 0. A second signal
cancels at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from rich.console import Console

from stagewise.console import console as make_console
from stagewise.engine.heap_freeze import freeze_heap
from stagewise.errors import ConfigError, EngineDied
from stagewise.hardware.listen_socket import listen_socket
from stagewise.server.app import guarded_app
from stagewise.server.engine_process import EngineProcess
from stagewise.server.http_protocol import protocol_class
from stagewise.server.load_display import API_KEY_ENV, usage_lines
from stagewise.server.request_path_warm_up import warm_request_path
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState
from stagewise.weights.model_path import check_model

_SHUTDOWN_TIMEOUT_S = 5
_MAX_HEADER_BYTES = 64 * 1024  # request line + headers; a larger head is refused with 400
_HTTP_NICE = 10  # how much lower the HTTP thread's CPU priority is than the engine's (see _yield_to_engine)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the runner drains first, then stops it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(settings: ServeSettings, console: Console | None = None) -> int:
    """Serve until a signal; returns the exit code. Raises the load error (e.g. DoesNotFit) if loading fails."""
    console = console or make_console()
    state = ServerState(settings)
    config = uvicorn.Config(guarded_app(state), host=settings.host, port=settings.port, log_level="warning",
                            lifespan="off", timeout_graceful_shutdown=_SHUTDOWN_TIMEOUT_S,
                            http=protocol_class(settings.header_timeout_s), timeout_keep_alive=settings.keep_alive_s,
                            limit_concurrency=settings.max_connections,
                            h11_max_incomplete_event_size=_MAX_HEADER_BYTES)
    server = _Server(config)
    loader = threading.Thread(target=_load, args=(state, server, console), name="stagewise-loader", daemon=True)
    drainer: list[threading.Thread] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not state.begin_draining():
            if state.engine is not None:
                state.engine.cancel_all()
            server.should_exit = True
            return
        # NOTE: no printing here: the handler may interrupt the main thread inside the console's lock
        thread = threading.Thread(target=_drain, args=(state, server, console, signal.Signals(signum).name),
                                  name="stagewise-drain", daemon=True)
        drainer.append(thread)
        thread.start()

    if settings.load.model is not None:
        check_model(settings.load.model)  # a missing file fails before the server listens
    sock = _bind(settings.host, settings.port)  # before loading: a busy port fails at once
    previous: dict[int, Any] = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    console.print(f"stagewise: listening on http://{settings.host}:{settings.port} (loading the model…)")
    try:
        loader.start()
        _yield_to_engine()
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    for thread in drainer:
        thread.join()
    if loader.is_alive():
        # NOTE: a signal while loading: exiting with the loader still inside torch aborts the process;
        # it finishes, sees the server draining, and frees what it loaded
        console.print("stagewise: stopping; waiting for the model load under way to end…")
        loader.join()
    if state.engine is not None:
        state.engine.stop()  # the engine process closes the model (frees the devices) and exits
        console.print("stagewise: model closed, devices freed; bye")
    if state.load_error is not None:
        raise state.load_error
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; :class:`ConfigError` naming the port when it cannot be had."""
    try:
        sock = listen_socket(host, port, backlog=2048)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)") from exc
    sock.set_inheritable(True)
    return sock


def _yield_to_engine() -> None:
    """Lower this thread's CPU priority (Linux nice is per thread; threads it starts inherit it) before it
    serves HTTP, so that on a machine short of cores a flood of requests takes CPU time from the HTTP work,
    not from the engine's steps that every admitted stream waits on. The loader thread, started before,
    keeps the default priority, and so do the engine processes it and the watchers spawn, the engine
    outputs' receiver and ZeroMQ's I/O thread. Nothing changes while cores are idle."""
    if sys.platform == "linux":  # elsewhere nice is per process: a restarted engine process would inherit it
        os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + _HTTP_NICE))


def _load(state: ServerState, server: uvicorn.Server, console: Console) -> None:
    """Start the engine process (it loads, warms up and prints the placement) and publish it once it serves."""
    settings = state.settings
    engine = EngineProcess(settings, on_phase=lambda phase: _on_phase(state, phase))
    try:
        engine.start()
    except BaseException as exc:
        try:
            engine.stop()
        finally:  # the load's error is what the server exits with, whatever stopping the process met
            state.set_failed(exc)
            server.should_exit = True
        return
    engine.on_death = lambda error: _restart(state, engine, server, console, error)
    _warm_request_path(engine, console)  # before the heap is frozen: the tokenizer's tables live as long as it
    freeze_heap()  # this process's imports and app, before it serves: full collections skip them
    if not state.set_ready(engine):
        engine.stop()
        return
    _print_usage(settings, state.served_names(engine.facts).name, console)


def _warm_request_path(engine: EngineProcess, console: Console) -> None:
    if (problem := warm_request_path(engine.facts)) is not None:
        console.print(f"stagewise: {problem}", style="yellow", highlight=False, markup=False)


def _on_phase(state: ServerState, phase: str) -> None:
    if phase == "warming_up":
        state.set_warming_up()


def _restart(state: ServerState, engine: EngineProcess, server: uvicorn.Server, console: Console,
             error: EngineDied) -> None:
    """The engine process died while serving (its requests failed already): 503 while a new one loads."""
    if not state.set_restarting():
        return  # draining: nothing to restart
    console.print(f"[red]stagewise: {error}[/]", highlight=False)
    try:
        engine.restart()
    except BaseException as exc:  # the model no longer loads: nothing left to serve
        console.print(f"[red]stagewise: the engine process did not restart: {exc}[/]", highlight=False)
        state.set_failed(exc)
        server.should_exit = True  # exits non-zero with that error
        return
    _warm_request_path(engine, console)  # a new tokenizer came with the new process's model description
    if state.set_ready(engine):
        console.print(f"stagewise: engine process restarted (pid {engine.pid}); serving again", highlight=False)


def _print_usage(settings: ServeSettings, name: str, console: Console) -> None:
    console.print(f"[bold green]Serving {name}[/] at {settings.base_url} (OpenAI-compatible)", highlight=False)
    key_in_env = settings.api_key is not None and os.environ.get(API_KEY_ENV) == settings.api_key
    for line in usage_lines(settings, key_in_env):
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def _drain(state: ServerState, server: uvicorn.Server, console: Console, why: str) -> None:
    console.print(f"[yellow]{why}: draining (up to {state.settings.grace_s:g} s)…[/]")
    engine = state.engine
    if engine is not None:
        clean = engine.drain(state.settings.grace_s)
        console.print("stagewise: drained" if clean else "stagewise: grace period over; cancelled the rest")
    server.should_exit = True
