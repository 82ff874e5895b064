"""The shared secret that authenticates the coordinator and its workers to each other.

Local workers get a fresh random secret per pool through the environment variable
:data:`SECRET_ENV` (only the same user can read a process's environment). Remote workers and
their coordinator share one: ``--worker-secret-file PATH`` (coordinator) / ``--secret-file PATH``
(worker), or ``$STAGEWISE_WORKER_SECRET``. At least :data:`MIN_SECRET_BYTES` bytes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from stagewise.errors import ConfigError

SECRET_ENV = "STAGEWISE_WORKER_SECRET"
SECRET_FILE_ENV = "STAGEWISE_WORKER_SECRET_FILE"
MIN_SECRET_BYTES = 16


def new_secret() -> bytes:
    """A fresh random secret (hex text, so it travels in an environment variable)."""
    return secrets.token_hex(32).encode()


def _checked(secret: bytes, where: str) -> bytes:
    secret = secret.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"the worker secret from {where} is too short ({len(secret)} bytes; at least "
                          f"{MIN_SECRET_BYTES}: e.g. `openssl rand -hex 32 > secret`)")
    return secret


def load_secret(path: str | None = None) -> bytes | None:
    """The secret from ``path``, else ``$STAGEWISE_WORKER_SECRET_FILE``, else ``$STAGEWISE_WORKER_SECRET``;
    None when none is given. :class:`ConfigError` for an unreadable file or a short secret."""
    path = path or os.environ.get(SECRET_FILE_ENV) or None
    if path is not None:
        try:
            return _checked(Path(path).read_bytes(), path)
        except OSError as exc:
            raise ConfigError(f"cannot read the worker secret file {path} ({exc.strerror})") from None
    value = os.environ.get(SECRET_ENV)
    return _checked(value.encode(), f"${SECRET_ENV}") if value is not None else None


def require_secret(path: str | None, who: str) -> bytes:
    """:func:`load_secret`, or :class:`ConfigError` saying how to give one; ``who``: ``a worker`` or
    ``the coordinator`` (the message names that side's option)."""
    secret = load_secret(path)
    if secret is None:
        option = "--secret-file" if who == "a worker" else "--worker-secret-file"
        raise ConfigError(f"{who} needs the workers' shared secret: {option} PATH or ${SECRET_ENV} "
                          "(the same on the coordinator and every worker)")
    return secret
