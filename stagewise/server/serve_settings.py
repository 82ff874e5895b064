"""ServeSettings: everything ``stagewise serve`` was asked for, converted once from the CLI and env."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from stagewise.engine.chat_template import check_template_kwargs
from stagewise.engine.load_settings import LoadSettings
from stagewise.engine.reasoning_stream import REASONING_FORMATS
from stagewise.errors import ConfigError

DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # 4 MiB
_ORIGIN = re.compile(r"[a-z][a-z0-9+.\-]*://[^/\s]+")  # an origin as browsers send it: no path, no slash


@dataclass(frozen=True)
class ServeSettings:
    """The model's load (``load``: one :class:`LoadSettings`, the same object ``run`` and ``bench`` load
    from; ``--max-seqs`` auto by default) and the HTTP options of one server process."""

    load: LoadSettings = field(default_factory=lambda: LoadSettings(max_seqs=None))
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    queue: int = 16
    grace_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    fault_injection: bool = False
    warm_up: bool = True  # on GPU stages, run synthetic requests before reporting ready
    peak_check: bool = True  # the warm-up ends with a full-context step; its allocator peak is measured
    prefix_cache: bool = True  # share cached prompt prefixes' KV blocks and state snapshots (--no-prefix-cache: off)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (CORS); "*" for any; () = off
    header_timeout_s: float = 10.0  # a connection's request headers must be complete this long after it opens
    body_timeout_s: float = 30.0  # a request's body must be complete this long after the server starts reading it
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this long (uvicorn's default)
    step_timeout_s: float = 120.0  # an engine process silent this long (a step that never ends) is stopped and replaced
    max_connections: int = 1024  # open connections (and requests in flight) before new requests get 503
    webui: bool = True  # serve the web page at / (the status endpoint is served either way)
    served_model_names: tuple[str, ...] = ()  # --served-model-name: the names requests may give (first listed)
    # auto: a thinking model's <think> block is returned as reasoning_content; none: left in the content
    reasoning_format: str = "auto"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # template variables under each request's

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        if self.queue < 1:
            raise ConfigError(f"--queue must be >= 1, got {self.queue}")
        if self.grace_s < 0:
            raise ConfigError(f"--grace-s must be >= 0, got {self.grace_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"the body size limit must be >= 1024 bytes, got {self.max_body_bytes}")
        for flag, seconds in (("--header-timeout-s", self.header_timeout_s), ("--body-timeout-s", self.body_timeout_s),
                              ("--keep-alive-s", self.keep_alive_s), ("--step-timeout-s", self.step_timeout_s)):
            if not 0 < seconds <= 3600:
                raise ConfigError(f"{flag} must be in (0, 3600], got {seconds}")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections must be >= 1, got {self.max_connections}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ConfigError(f"--reasoning-format must be one of {', '.join(REASONING_FORMATS)}, got {self.reasoning_format!r}")
        check_template_kwargs(self.chat_template_kwargs)
        if any(not name.strip() for name in self.served_model_names):
            raise ConfigError("--served-model-name must not be empty")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ConfigError(f"--cors-origin must be '*' or scheme://host[:port] (no path), got {origin!r}")

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"
