"""Guards: ASGI middleware for the API key, the body size limit and per-endpoint request counts."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stagewise.engine.metrics import EngineMetrics
from stagewise.errors import StagewiseError
from stagewise.server.openai_errors import BodyTooLarge, Unauthorized, error_response

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
             "/v1/models", "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/ps", "/api/version",
             "/health", "/metrics", "/debug/fail-next-step", "/debug/step-delay", "/tokenize", "/detokenize", "/v1/stagewise/status", "/")
_PROTECTED_PREFIXES = ("/v1/", "/api/", "/debug/", "/tokenize", "/detokenize")


class Guards:
    """Rejects unauthenticated (401) and oversized (413, by Content-Length) requests before routing.

    ``/health`` and ``/metrics`` stay open so orchestrators can probe without the key, and so does the
    web page (``/``, ``/webui/*``): it asks for the key and sends it on its ``/v1`` requests.
    """

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int, metrics: EngineMetrics) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        status = {"code": 500}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            rejection = self._check(scope)
            if rejection is not None:
                await error_response(rejection, path)(scope, receive, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            endpoint = path if path in ENDPOINTS else "other"
            self.metrics.http_requests.labels(endpoint, str(status["code"])).inc()

    def _check(self, scope: Scope) -> StagewiseError | None:
        headers: dict[str, Any] = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return BodyTooLarge(f"the request body is {int(length)} bytes; the limit is {self.max_body_bytes}")
        path = scope.get("path", "")
        if self.api_key is not None and path.startswith(_PROTECTED_PREFIXES):
            bearer = headers.get("authorization", "")  # OpenAI's clients
            key = headers.get("x-api-key")  # Anthropic's
            given, expected = ((key, self.api_key) if key is not None and not bearer
                               else (bearer, f"Bearer {self.api_key}"))
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return Unauthorized("missing or incorrect API key: send 'Authorization: Bearer <key>' or "
                                    "'x-api-key: <key>'")
        return None
