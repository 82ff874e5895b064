"""SealedStore: the coordinator's TCPStore with every message signed and checked.

Each value written with :meth:`SealedStore.set` is ``MAGIC + HMAC-SHA256 + payload``; the MAC
covers the pool's session nonce, the key and the payload, keyed by the shared secret
(:mod:`stagewise.runtime.worker_secret`). So a process that can reach the store but lacks the
secret cannot write a message anyone acts on, a message of one key cannot be replayed under
another (each command, acknowledgement and output has a key of its own: ``cmd/{seq}``,
``ack/{seq}/{rank}``...), and a message of an earlier pool (another session) is refused too.
:meth:`SealedStore.get` raises :class:`WorkerMessageRejected` for an unsigned, forged or
oversized value and logs one line per rejected value.

Counters (``store.add``: acknowledgement counts, heartbeats) and the process group's own
rendezvous keys cannot be signed: a stranger who reaches the store can delay or disturb (a
denial of service), not command. Values are authenticated, not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from stagewise.errors import WorkerMessageRejected

MAGIC = b"SWS1"
MAC_BYTES = 32
MAX_MESSAGE_BYTES = 1 << 30  # the largest value read at all (an exit's logits for a long prefill chunk)
SESSION_KEY = "session"  # the pool's nonce (hex), written raw by the coordinator once
T = TypeVar("T")


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class SealedStore:
    """``raw`` (a TCPStore) with signed ``set``/``get``; ``who`` names this side in log lines."""

    def __init__(self, raw: dist.Store, secret: bytes, session: str, who: str,
                 log: Callable[[str], None] = stderr_log) -> None:
        self.raw = raw
        self._secret = secret
        self._session = session.encode()
        self.who = who
        self._log = log
        self._reported: set[tuple[str, bytes]] = set()

    def _mac(self, key: str, payload: bytes) -> bytes:
        msg = b"stagewise-worker-v1\0" + self._session + b"\0" + key.encode() + b"\0" + payload
        return hmac.new(self._secret, msg, hashlib.sha256).digest()

    def seal(self, key: str, value: str | bytes) -> bytes:
        payload = value.encode() if isinstance(value, str) else bytes(value)
        return MAGIC + self._mac(key, payload) + payload

    def unseal(self, key: str, blob: bytes) -> bytes:
        """The payload of ``blob`` read at ``key``; :class:`WorkerMessageRejected` unless it is signed
        with this session's secret for this very key."""
        if len(blob) > MAX_MESSAGE_BYTES + len(MAGIC) + MAC_BYTES:
            self.reject(key, blob, f"{len(blob)} bytes (limit {MAX_MESSAGE_BYTES})")
        if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + MAC_BYTES:
            self.reject(key, blob, "unsigned")
        mac, payload = blob[len(MAGIC) : len(MAGIC) + MAC_BYTES], blob[len(MAGIC) + MAC_BYTES :]
        if not hmac.compare_digest(mac, self._mac(key, payload)):
            self.reject(key, blob, "bad signature (another secret, another session or another key)")
        return payload

    def reject(self, key: str, blob: bytes, why: str) -> None:
        """Log (once per distinct value) and raise :class:`WorkerMessageRejected`."""
        message = f"rejected the message at {key!r}: {why}"
        digest = hashlib.sha256(blob).digest()
        if (key, digest) not in self._reported:
            if len(self._reported) > 10_000:
                self._reported.clear()
            self._reported.add((key, digest))
            self._log(f"stagewise {self.who}: {message}")
        raise WorkerMessageRejected(message)

    # ----- the store surface ---------------------------------------------------------------------

    def set(self, key: str, value: str | bytes) -> None:
        self.raw.set(key, self.seal(key, value))  # type: ignore[arg-type]  # the store takes bytes too

    def get(self, key: str) -> bytes:
        return self.unseal(key, bytes(self.raw.get(key)))

    def read(self, key: str, parse: Callable[[bytes], T]) -> T:
        """``parse`` of the verified payload at ``key``; a payload ``parse`` rejects (it raises
        :class:`WorkerMessageRejected`) is logged like a bad signature."""
        blob = bytes(self.raw.get(key))
        payload = self.unseal(key, blob)
        try:
            return parse(payload)
        except WorkerMessageRejected as exc:
            self.reject(key, blob, str(exc))
            raise  # unreachable: reject raises

    def check(self, keys: list[str]) -> bool:
        return bool(self.raw.check(keys))

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self.raw.wait(keys, timeout)

    def add(self, key: str, amount: int) -> int:
        return int(self.raw.add(key, amount))

    def delete_key(self, key: str) -> bool:
        return bool(self.raw.delete_key(key))
