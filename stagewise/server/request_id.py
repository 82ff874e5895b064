"""RequestIds: ASGI middleware giving every HTTP request an id, the client's ``X-Request-Id`` or a new one.

The id is echoed in the response's ``X-Request-Id`` header (errors included) and stored in
``scope["state"]["request_id"]``, where the completion handlers take it as the base of the
completion id (``chatcmpl-<id>``), as vLLM does. A client id must be 1–128 characters of
``A-Z a-z 0-9 . _ : -``; anything else is a 400 naming the header (it would end up in logs and ids).
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stagewise.server.openai_errors import InvalidParam, error_response

HEADER = "X-Request-Id"
MAX_CHARS = 128
_VALID = re.compile(rf"[A-Za-z0-9._:\-]{{1,{MAX_CHARS}}}")


def new_request_id() -> str:
    """32 random hex digits."""
    return uuid.uuid4().hex


def request_id_of(scope: Scope) -> str:
    """The id :class:`RequestIds` gave this request (a fresh one outside the middleware, e.g. in tests)."""
    state = scope.get("state") or {}
    found = state.get("request_id")
    return found if isinstance(found, str) else new_request_id()


class RequestIds:
    """Validates or makes the request id, stores it in the scope, and echoes it on the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == HEADER.lower().encode()), None)
        valid = given is not None and _VALID.fullmatch(given) is not None
        rid = given if given is not None and valid else new_request_id()
        scope.setdefault("state", {})["request_id"] = rid

        async def echoing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER.lower().encode(), rid.encode())]
            await send(message)

        if given is not None and not valid:
            error = InvalidParam(f"the {HEADER} header must be 1-{MAX_CHARS} characters of A-Z a-z 0-9 . _ : -",
                                 HEADER)
            await error_response(error, scope.get("path", ""))(scope, receive, echoing_send)
            return
        await self.app(scope, receive, echoing_send)
