"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` (Anthropic's on its routes)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from stagewise.engine.scheduler import QueueFull
from stagewise.errors import RequestError, StagewiseError
from stagewise.server.apis import anthropic_format

OLLAMA_PATH = "/api/"  # Ollama's routes answer errors in its shape

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    503: "service_unavailable",
}


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


class InvalidParam(RequestError):
    """A request field with a bad value; ``param`` names it as OpenAI does (``messages.0.content``)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class Unauthorized(StagewiseError):
    """No API key, or the wrong one (``Authorization: Bearer KEY``, or Anthropic's ``x-api-key: KEY``)."""

    http_status = 401
    code = "invalid_api_key"


class BodyTooLarge(StagewiseError):
    http_status = 413
    code = "request_too_large"


class BodyTimeout(StagewiseError):
    """The request body did not arrive within ``--body-timeout-s``."""

    http_status = 408
    code = "request_timeout"


class NotFound(StagewiseError):
    http_status = 404
    code = "not_found"


class UnknownModel(NotFound):
    """``GET /v1/models/{id}`` for a model this server does not serve."""

    code = "model_not_found"
    param = "model"


def error_body(status: int, message: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def typed_error_body(exc: StagewiseError) -> dict[str, Any]:
    """OpenAI's error body for a typed error (also the last event of a stream that failed)."""
    return error_body(exc.http_status, str(exc), exc.code, getattr(exc, "param", None))


def shaped_body(path: str, status: int, message: str, code: str | None = None,
                param: str | None = None) -> dict[str, Any]:
    """The error body as the route at ``path`` answers it: Anthropic's under ``/v1/messages``, Ollama's
    (``{"error": message}``) under ``/api/``, else OpenAI's."""
    if path.startswith(anthropic_format.ANTHROPIC_PATH):
        return anthropic_format.error_body(status, message)
    if path.startswith(OLLAMA_PATH):
        return {"error": message}
    return error_body(status, message, code, param)


def error_response(exc: StagewiseError, path: str = "") -> JSONResponse:
    """The HTTP response for a typed error on the route at ``path`` (429 carries ``Retry-After``)."""
    headers = {"Retry-After": str(QueueFull.retry_after_s)} if isinstance(exc, QueueFull) else None
    body = shaped_body(path, exc.http_status, str(exc), exc.code, getattr(exc, "param", None))
    return JSONResponse(body, exc.http_status, headers=headers)


def from_validation(exc: ValidationError) -> InvalidParam:
    """The first pydantic error as an :class:`InvalidParam` naming its field."""
    first = exc.errors()[0]
    # union members appear in the location (``stop.str``, ``stop.list[str].0``); keep the field path
    parts = [str(p) for p in first.get("loc", ()) if isinstance(p, int) or (str(p).isidentifier()
                                                                               and str(p) not in _TYPE_NAMES)]
    param = ".".join(parts) or None
    return InvalidParam(f"invalid value for {param or 'the request body'}: {first.get('msg', 'invalid')}", param)
