"""ServeSettings: everything ``stagewise serve`` was asked for, converted once from the CLI and env."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stagewise.errors import ConfigError
from stagewise.runtime.worker_mode import check_worker_options

DEFAULT_MAX_BODY_BYTES = 4 * 2**20  # 4 MiB
_ORIGIN = re.compile(r"[a-z][a-z0-9+.\-]*://[^/\s]+")  # an origin as browsers send it: no path, no slash


@dataclass(frozen=True)
class ServeSettings:
    """Model, devices and HTTP options of one server process."""

    model: str | None = None
    devices: str | None = None
    placement: str = "auto"
    context: int = 4096
    dtype: str | None = None
    prefill_chunk: int = 512
    reserve: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    queue: int = 16
    grace_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    fault_injection: bool = False
    cuda_graphs: bool = True
    workers: str | None = None  # None: stages in this process; "local" or "N@HOST:PORT": worker processes
    worker_timeout_s: float = 30.0
    worker_secret_file: str | None = None  # remote workers' shared secret (default: the environment)
    measure_links: bool = True  # time the links between joined workers before planning
    warm_up: bool = True  # on GPU stages, run synthetic requests before reporting ready
    max_seqs: int | None = None  # sequences decoded together; None: auto (the most that fit, up to 8)
    kv_tokens: int | None = None  # KV pool positions per stage; None: every sequence slot its whole context
    prefix_cache: bool = True  # share cached prompt prefixes' KV blocks and state snapshots (--no-prefix-cache: off)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (CORS); "*" for any; () = off
    header_timeout_s: float = 10.0  # a connection's request headers must be complete this long after it opens
    body_timeout_s: float = 30.0  # a request's body must be complete this long after the server starts reading it
    keep_alive_s: int = 5  # an idle keep-alive connection is closed after this long (uvicorn's default)
    max_connections: int = 1024  # open connections (and requests in flight) before new requests get 503
    webui: bool = True  # serve the web page at / (the status endpoint is served either way)
    served_model_names: tuple[str, ...] = ()  # --served-model-name: the names requests may give (first listed)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        if self.queue < 1:
            raise ConfigError(f"--queue must be >= 1, got {self.queue}")
        if self.context < 2:
            raise ConfigError(f"--context must be >= 2, got {self.context}")
        if self.prefill_chunk < 1:
            raise ConfigError(f"--prefill-chunk must be >= 1, got {self.prefill_chunk}")
        if self.max_seqs is not None and not 1 <= self.max_seqs <= 4096:
            raise ConfigError(f"--max-seqs must be in [1, 4096] or auto, got {self.max_seqs}")
        check_worker_options(self.workers)  # a malformed --workers: refused before the HTTP socket or a store opens
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ConfigError(f"--kv-tokens must be >= 1, got {self.kv_tokens}")
        if self.grace_s < 0:
            raise ConfigError(f"--grace-s must be >= 0, got {self.grace_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"the body size limit must be >= 1024 bytes, got {self.max_body_bytes}")
        for flag, seconds in (("--header-timeout-s", self.header_timeout_s), ("--body-timeout-s", self.body_timeout_s),
                              ("--keep-alive-s", self.keep_alive_s)):
            if not 0 < seconds <= 3600:
                raise ConfigError(f"{flag} must be in (0, 3600], got {seconds}")
        if self.max_connections < 1:
            raise ConfigError(f"--max-connections must be >= 1, got {self.max_connections}")
        if self.api_key is not None and not self.api_key:
            raise ConfigError("--api-key must not be empty")
        if any(not name.strip() for name in self.served_model_names):
            raise ConfigError("--served-model-name must not be empty")
        for origin in self.cors_origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ConfigError(f"--cors-origin must be '*' or scheme://host[:port] (no path), got {origin!r}")

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"
