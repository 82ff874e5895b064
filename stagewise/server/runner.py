"""Run the server: HTTP up first (``/health`` 503 while loading), load in the background, drain on signals.

SIGTERM/SIGINT: stop accepting (503), let in-flight and queued requests finish within
``grace_s``, cancel what is left, close the model (free the devices), exit 0. A second signal
cancels at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn
from rich.console import Console

from stagewise.cli.console import console as make_console
from stagewise.engine.engine import Engine
from stagewise.engine.model_loading import load_with_progress
from stagewise.engine.request_log import print_requests
from stagewise.engine.warm_up import needs_warm_up
from stagewise.errors import ConfigError
from stagewise.hardware.listen_socket import listen_socket
from stagewise.server.app import guarded_app
from stagewise.server.http_protocol import protocol_class
from stagewise.server.load_display import API_KEY_ENV, placement_lines, usage_lines
from stagewise.server.random_tokenizer import with_demo_tokenizer
from stagewise.server.serve_settings import ServeSettings
from stagewise.server.server_state import ServerState

_SHUTDOWN_TIMEOUT_S = 5
_MAX_HEADER_BYTES = 64 * 1024  # request line + headers; a larger head is refused with 400


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling (the runner drains first, then stops it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(settings: ServeSettings, console: Console | None = None) -> int:
    """Serve until a signal; returns the exit code. Raises the load error (e.g. DoesNotFit) if loading fails."""
    console = console or make_console()
    print_requests()  # one INFO line per finished request on stderr
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
                state.engine.scheduler.cancel_all()
            server.should_exit = True
            return
        # NOTE: no printing here: the handler may interrupt the main thread inside the console's lock
        thread = threading.Thread(target=_drain, args=(state, server, console, signal.Signals(signum).name),
                                  name="stagewise-drain", daemon=True)
        drainer.append(thread)
        thread.start()

    sock = _bind(settings.host, settings.port)  # before loading: a busy port fails at once
    previous: dict[int, Any] = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    console.print(f"stagewise: listening on http://{settings.host}:{settings.port} (loading the model…)")
    try:
        loader.start()
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
    if state.load_error is not None:
        raise state.load_error
    if state.engine is not None:
        state.engine.stop()
    if state.model is not None:
        state.model.close()
        console.print("stagewise: model closed, devices freed; bye")
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; :class:`ConfigError` naming the port when it cannot be had."""
    try:
        sock = listen_socket(host, port, backlog=2048)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose another --port)") from exc
    sock.set_inheritable(True)
    return sock


def _load(state: ServerState, server: uvicorn.Server, console: Console) -> None:
    settings = state.settings
    try:
        # without the prefix cache: no recurrent-state snapshot memory
        load = settings.load if settings.prefix_cache else dataclasses.replace(settings.load, prefix_snapshots=0)
        model = load_with_progress(load)
    except BaseException as exc:
        state.set_failed(exc)
        server.should_exit = True
        return
    try:
        if model.tokenizer is None and (settings.load.model or "").startswith("random:"):
            model = with_demo_tokenizer(model)  # random weights come without a tokenizer
        engine = Engine(model, settings.queue, state.metrics, prefix_cache=settings.prefix_cache)
        pool = model.pipeline.kv_pool
        pool_text = f", a KV pool of {pool.tokens} positions (--kv-tokens)" if pool is not None else ""
        console.print(f"stagewise: up to {engine.batcher.slots} sequences at once, "
                      f"{model.max_context:,} positions each (--max-seqs, --context){pool_text}", highlight=False)
        if settings.warm_up and needs_warm_up(model) and state.set_warming_up():
            console.print("stagewise: warming up (compiling kernels, capturing CUDA graphs)…")
            done = engine.warm_up(full_context=settings.peak_check)
            console.print(f"stagewise: {done.summary()}", highlight=False)
        engine.start()
    except BaseException as exc:
        model.close()  # the devices are freed before the server exits with the error
        state.set_failed(exc)
        server.should_exit = True
        return
    if not state.set_ready(model, engine):
        engine.stop()
        model.close()
        return
    for line in placement_lines(model):
        console.print(line, highlight=False, soft_wrap=True)
    _print_usage(settings, state.served_names(model).name, console)


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
