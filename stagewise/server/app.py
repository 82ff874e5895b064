"""The OpenAI-compatible HTTP API: routes, body reading, and error mapping."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import anyio
import anyio.to_thread
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from pydantic_core import from_json
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from stagewise.errors import StagewiseError
from stagewise.server import chat_handler, completion_handler, tokenize_handler
from stagewise.server.apis import anthropic_handler, ollama_handler, responses_handler
from stagewise.server.apis.anthropic_request import build_messages, count_tokens
from stagewise.server.apis.anthropic_schemas import CountTokensBody, MessagesBody
from stagewise.server.apis.ollama_request import build_ollama_chat, build_ollama_generate
from stagewise.server.apis.ollama_schemas import OllamaChatBody, OllamaGenerateBody, OllamaShowBody
from stagewise.server.apis.responses_request import build_responses
from stagewise.server.apis.responses_schemas import ResponsesBody
from stagewise.server.choices import Choices
from stagewise.server.client_socket import client_transport
from stagewise.server.guards import Guards
from stagewise.server.model_facts import ModelFacts
from stagewise.server.openai_errors import (
    BodyTimeout,
    BodyTooLarge,
    InvalidParam,
    NotFound,
    error_response,
    from_validation,
    shaped_body,
)
from stagewise.server.output_stream import ClientGone
from stagewise.server.request_builder import BuiltRequest, build_chat, build_completion
from stagewise.server.request_id import HEADER as REQUEST_ID_HEADER
from stagewise.server.request_id import RequestIds, request_id_of
from stagewise.server.schemas import ChatCompletionBody, CompletionBody, DetokenizeBody, TokenizeBody
from stagewise.server.server_state import ServerState
from stagewise.server.status_report import StatusReport
from stagewise.server.webui import add_webui

_CLIENT_CLOSED = 499
SERVED_ROUTES = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages, "
                 "POST /v1/messages/count_tokens, Ollama's POST /api/chat, /api/generate, /api/show and GET /api/tags, "
                 "/api/ps, /api/version, "
                 "GET /v1/models, POST /tokenize, POST /detokenize, GET /health, GET /metrics and "
                 "GET /v1/stagewise/status")


async def read_json(request: Request, limit_bytes: int, timeout_s: float) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``limit_bytes`` (also without Content-Length), 408 unless all of
    it arrives within ``timeout_s`` (a client trickling its body holds a connection and a buffer), 400 if
    not JSON."""
    size = 0
    parts = []
    with anyio.move_on_after(timeout_s) as reading:
        async for part in request.stream():
            size += len(part)
            if size > limit_bytes:
                raise BodyTooLarge(f"the request body exceeds the limit of {limit_bytes} bytes")
            parts.append(part)
    if reading.cancelled_caught:
        raise BodyTimeout(f"the request body was not complete within {timeout_s:g} s (--body-timeout-s); "
                          f"{size} bytes had arrived")
    return parse_json(b"".join(parts))


MAX_JSON_DEPTH = 64  # arrays and objects inside each other; far more than any OpenAI body needs


def parse_json(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object whose strings are all valid Unicode and whose nesting is at most
    :data:`MAX_JSON_DEPTH`; :class:`InvalidParam` (400) otherwise, never a crash.

    Parsed on the event loop, holding the GIL (the other streams wait meanwhile), so by pydantic-core's
    parser: 6-8x faster than the standard library's on a body of megabytes (0.5 ms for 3.9 MB, not
    3-4 ms), and it stops at once past its nesting limit (deeper than ours). A body it refuses otherwise is
    parsed again by :mod:`json` (:func:`_parse_slowly`), for a message naming what is wrong and where: a body
    that is not UTF-8 (UTF-16, say), a byte-order mark, a syntax error; lone surrogates, escaped or encoded,
    are refused by :func:`_check_values`, naming the field."""
    try:
        body = from_json(data)
    except ValueError as exc:
        if "recursion limit" in str(exc):  # pydantic-core nests 200 deep at most: past MAX_JSON_DEPTH
            raise InvalidParam(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from exc
        body = _parse_slowly(data)
    if not isinstance(body, dict):
        raise InvalidParam("the request body must be a JSON object")
    _check_values(body)
    return body


def _parse_slowly(data: bytes) -> Any:
    """``data`` parsed by :mod:`json` as UTF-8 text without a byte-order mark (RFC 8259; :mod:`json` alone would
    take UTF-16 and a BOM); :class:`InvalidParam` naming what is wrong and where. Surrogates encoded as UTF-8
    bytes (CESU-8) decode here, to be refused by :func:`_check_values` naming their field."""
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise InvalidParam(f"the request body is not UTF-8 text (byte {exc.start}); JSON bodies are UTF-8") from exc
    if text.startswith("\ufeff"):
        raise InvalidParam("the request body starts with a byte-order mark; JSON bodies are UTF-8 without one")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParam(f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                           ) from exc
    except RecursionError as exc:
        raise InvalidParam(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:  # an integer of over 4300 digits
        raise InvalidParam("the request body holds a number with too many digits") from exc


def _check_values(body: dict[str, Any]) -> None:
    """Reject lone surrogates (``"\\ud800"``: no text can be encoded from them) and deep nesting, walking
    the parsed body without recursion; ``param`` names the first bad value."""
    stack: list[tuple[str, Any, int]] = [(str(k), v, 1) for k, v in body.items()]
    stack.extend(("", key, 1) for key in body if not key.isascii())  # the keys too (unknown ones are ignored)
    while stack:
        path, value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidParam(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", path.split(".")[0])
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InvalidParam(f"invalid value for {path or 'a key of the request body'}: a lone UTF-16 "
                                       f"surrogate at character {exc.start} is not text", path or None) from exc
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}", v, depth + 1) for k, v in value.items())
            for key in value:
                if not key.isascii():
                    stack.append((path, key, depth + 1))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", v, depth + 1) for i, v in enumerate(value))


def _preparers() -> int:
    """Threads that render and tokenize prompts at once: all cores but one, left to the engine's steps."""
    return max(1, (os.cpu_count() or 2) - 1)


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI app over ``state``; wrapped by :class:`Guards` (auth, body size, counts)."""
    settings = state.settings
    # NOTE: tokenizing releases the GIL but not the core: on a 2-core machine four big prompts at once would
    # take the engine's core too; bounded here (and each prompt's work by its byte check, request_builder)
    limiters: list[anyio.CapacityLimiter] = []  # made on first use: a limiter belongs to the running loop

    def preparing() -> anyio.CapacityLimiter:
        if not limiters:
            limiters.append(anyio.CapacityLimiter(_preparers()))
        return limiters[0]
    app = FastAPI(title="stagewise", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(StagewiseError)
    async def _typed(request: Request, exc: StagewiseError) -> Response:
        return error_response(exc, request.url.path)

    @app.exception_handler(ClientGone)
    async def _gone(_: Request, exc: ClientGone) -> Response:
        return Response(status_code=_CLIENT_CLOSED)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        # a bug, not the user's mistake: answer in the API's shape, keep serving, keep the traceback
        traceback.print_exception(exc, file=sys.stderr)
        return JSONResponse(shaped_body(request.url.path, 500, "internal error (a bug, logged by the server)"), 500)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        route = f"{request.method} {request.url.path}"
        path = request.url.path
        if exc.status_code == 404:  # /v1/embeddings, /v1/audio/...: OpenAI's words, then what is served
            body = shaped_body(path, 404, f"Invalid URL ({route}): this server does not serve that route; it serves "
                                          f"{SERVED_ROUTES}", "not_found")
            return JSONResponse(body, 404)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "another method")
            return JSONResponse(shaped_body(path, 405, f"{route}: that route takes {allowed}", "method_not_allowed"),
                                405, headers=exc.headers)
        return JSONResponse(shaped_body(path, exc.status_code, str(exc.detail)), exc.status_code)

    @app.get("/health")
    async def health() -> Response:
        if state.phase == "ready":
            report = state.worker_report()  # worker processes' liveness: what admission reads too
            if report is not None and report["status"] != "ok":  # a lost worker: name it and its stages
                return JSONResponse({"status": report["status"], "message": report["message"],
                                     "workers": report["workers"]}, status_code=503)
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": state.phase}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        engine = state.engine
        families = await engine.engine_families() if engine is not None else None  # the engine's own series
        return Response(state.metrics.render(families), media_type=CONTENT_TYPE_LATEST)

    def card(model: ModelFacts) -> dict[str, Any]:
        return {"id": state.served_names(model).name, "object": "model", "created": int(time.time()),
                "owned_by": "stagewise", "max_model_len": model.max_context}

    status = StatusReport(state)

    @app.get("/v1/stagewise/status")
    async def stagewise_status() -> Response:
        engine = state.engine
        families = await engine.engine_families() if engine is not None else []  # the engine's reply
        started = time.perf_counter()
        response = JSONResponse(status.body(families))  # reads only: see StatusReport; never waits for a step
        state.metrics.status_seconds.inc(time.perf_counter() - started)  # its cost on the event loop
        return response

    if settings.webui:
        add_webui(app)

    @app.get("/v1/models")
    async def models() -> Response:
        _, model = state.serving()
        return JSONResponse({"object": "list", "data": [card(model)]})

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str) -> Response:
        _, model = state.serving()
        state.served_names(model).check(model_id)
        return JSONResponse(card(model))

    async def validated(request: Request, schema: Any) -> Any:
        """The body read (413/400) and validated with ``schema`` (400 naming the field)."""
        raw = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
        try:
            return schema.model_validate(raw)
        except ValidationError as exc:
            raise from_validation(exc) from exc

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = await validated(request, TokenizeBody)
        _, model = state.serving()
        return JSONResponse(await anyio.to_thread.run_sync(tokenize_handler.tokenize, body, model,
                                                           settings.chat_template_kwargs, limiter=preparing()))

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = await validated(request, DetokenizeBody)
        _, model = state.serving()
        return JSONResponse(tokenize_handler.detokenize(body, model))

    def configured(build: Any) -> Any:
        """``build`` (a chat-path request builder) with this server's ``--reasoning-format`` and
        ``--chat-template-kwargs``."""
        def built(body: Any, model: ModelFacts, request_id: str) -> BuiltRequest:
            return build(body, model, request_id, split_reasoning=settings.reasoning_format != "none",
                         template_kwargs=settings.chat_template_kwargs)
        return built

    async def generate(request: Request, schema: Any, build: Any, respond: Any) -> Response:
        """Validate the body with ``schema``, ``build`` the engine requests (one per choice), submit them,
        ``respond``."""
        raw = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
        engine, model = state.serving()
        request_id = request_id_of(request.scope)

        def prepare() -> Any:
            try:
                body = schema.model_validate(raw)
            except ValidationError as exc:
                raise from_validation(exc) from exc
            state.served_names(model).check(body.model)  # 404 model_not_found, as vLLM
            return build(body, model, request_id)

        # NOTE: rendering the chat template and tokenizing a body of megabytes takes seconds: in a
        # worker thread, so /health and the other streams keep being served meanwhile
        built = await anyio.to_thread.run_sync(prepare, limiter=preparing())
        choices = await Choices.submit(engine, built.requests, client_transport(request.scope))
        response: Response = await respond(built, choices, state.served_names(model).name, request)
        return response

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, ChatCompletionBody, configured(build_chat), chat_handler.respond)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:  # OpenAI's Responses API, stateless
        return await generate(request, ResponsesBody, configured(build_responses), responses_handler.respond)

    # Ollama's API, for the tools that speak only it
    started_at = ollama_handler.now()

    @app.post("/api/chat")
    async def ollama_chat(request: Request) -> Response:
        return await generate(request, OllamaChatBody, configured(build_ollama_chat), ollama_handler.responder(False))

    @app.post("/api/generate")
    async def ollama_generate(request: Request) -> Response:
        return await generate(request, OllamaGenerateBody, configured(build_ollama_generate),
                              ollama_handler.responder(True))

    @app.get("/api/tags")
    async def ollama_tags() -> Response:
        _, model = state.serving()
        return JSONResponse(ollama_handler.tags(state.served_names(model).name, model, started_at))

    @app.get("/api/ps")
    async def ollama_ps() -> Response:
        _, model = state.serving()
        return JSONResponse(ollama_handler.running(state.served_names(model).name, model))

    @app.post("/api/show")
    async def ollama_show(request: Request) -> Response:
        body = await validated(request, OllamaShowBody)
        _, model = state.serving()
        state.served_names(model).check(body.model or body.name)
        return JSONResponse(ollama_handler.show(model))

    @app.get("/api/version")
    async def ollama_version() -> Response:
        return JSONResponse(ollama_handler.version())

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:  # Anthropic's Messages API
        return await generate(request, MessagesBody, configured(build_messages), anthropic_handler.respond)

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request) -> Response:
        body = await validated(request, CountTokensBody)
        _, model = state.serving()
        state.served_names(model).check(body.model)
        count = await anyio.to_thread.run_sync(count_tokens, body, model, settings.chat_template_kwargs,
                                               limiter=preparing())
        return JSONResponse({"input_tokens": count})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, CompletionBody, build_completion, completion_handler.respond)

    if settings.fault_injection:
        @app.post("/debug/fail-next-step")
        async def fail_next_step(request: Request) -> Response:
            raw = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
            engine, model = state.serving()
            stage = raw.get("stage", 0)
            if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < model.stages:
                raise InvalidParam(f"stage must be an integer in [0, {model.stages})", "stage")
            engine.fail_next_step(stage)
            return JSONResponse({"armed": True, "stage": stage})

        @app.post("/debug/step-delay")
        async def step_delay(request: Request) -> Response:
            raw = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
            engine, _ = state.serving()
            seconds = raw.get("seconds", 0.0)
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 10:
                raise InvalidParam("seconds must be a number in [0, 10]", "seconds")
            engine.set_step_delay(float(seconds))
            return JSONResponse({"delay_s": float(seconds)})
    else:
        @app.post("/debug/fail-next-step")
        @app.post("/debug/step-delay")
        async def no_fault_injection() -> Response:
            raise NotFound("fault injection is off (set STAGEWISE_FAULT_INJECTION=1)")

    return app


def guarded_app(state: ServerState) -> ASGIApp:
    """The ASGI app to serve: :func:`build_app` behind :class:`Guards`, then :class:`RequestIds`, then
    (with ``--cors-origin``) CORS, which answers preflights before the API key is asked for."""
    settings = state.settings
    app: ASGIApp = RequestIds(Guards(build_app(state), settings.api_key, settings.max_body_bytes, state.metrics))
    if settings.cors_origins:
        # NOTE: no credentials (cookies): the API key travels in a header the browser is allowed to send
        app = CORSMiddleware(app, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                             allow_headers=["*"], expose_headers=[REQUEST_ID_HEADER], max_age=600)
    return app
