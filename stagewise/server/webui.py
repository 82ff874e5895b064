"""The web UI: the static page and its scripts, packaged in ``stagewise/assets/webui``, served at ``/``.

Plain files (no build step, nothing fetched from elsewhere), read once when the app is built. The
page itself is served without the API key; everything it shows comes from ``/v1`` endpoints, which
ask for the key as any client's requests do.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from starlette.responses import Response

from stagewise.server.openai_errors import NotFound

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# NOTE: the page talks to its own origin only; no inline script, so an injected string cannot run
_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


def webui_files() -> dict[str, bytes]:
    """Every file of the packaged page, by name (``index.html``, ``app.js``, …)."""
    folder = resources.files("stagewise") / "assets" / "webui"
    return {item.name: item.read_bytes() for item in folder.iterdir()
            if item.is_file() and "." + item.name.rpartition(".")[2] in _TYPES}


def add_webui(app: FastAPI) -> None:
    """``GET /`` (the page) and ``GET /webui/NAME`` (its files) on ``app``; ``HEAD`` of each answers its
    headers (uptime checks and link previews ask that way)."""
    files = webui_files()

    def answer(name: str) -> Response:
        body = files.get(name)
        if body is None:
            raise NotFound(f"no web UI file {name!r}")
        return Response(body, media_type=_TYPES["." + name.rpartition(".")[2]], headers=_HEADERS)

    @app.api_route("/", methods=["GET", "HEAD"])
    async def page() -> Response:
        return answer("index.html")

    @app.api_route("/webui/{name}", methods=["GET", "HEAD"])
    async def asset(name: str) -> Response:
        return answer(name)
