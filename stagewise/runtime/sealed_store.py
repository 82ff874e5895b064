"""SealedStore: the coordinator's TCPStore with every message signed and checked.

Each value written with :meth:`SealedStore.set` is ``MAGIC + HMAC-SHA256 + payload``; the MAC
covers the pool's session nonce, the key and the payload, keyed by the shared secret
(:mod:`stagewise.runtime.worker_secret`). So a process that can reach the store but lacks the
secret cannot write a message anyone acts on, a message of one key cannot be replayed under
another (each command, acknowledgement and output has a key of its own: ``cmd/{seq}``,
``ack/{seq}/{rank}``...), and a message of an earlier pool (another session) is refused too.
:meth:`SealedStore.get` raises :class:`WorkerMessageRejected` for an unsigned, forged or
oversized value and logs one line per rejected value.

A payload over :data:`PART_BYTES` (an exit's logits or features for many rows: a TCPStore message
holds at most 8 MiB) is written as parts ``{key}#0 ..``, each signed under its own key, then the
key itself holds a signed index (part count and total bytes); :meth:`SealedStore.get` joins them
and checks the total, and :meth:`SealedStore.delete_key` deletes them with their key.

Counters (``store.add``: acknowledgement counts, heartbeats) and the process group's own
rendezvous keys cannot be signed: a stranger who reaches the store can delay or disturb (a
denial of service), not command. Values are authenticated, not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import json
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
PART_BYTES = 4 << 20  # larger payloads go in parts (a TCPStore message is at most 8 MiB)
PARTS = b"SWSPARTS"  # the payload of a key whose value is in parts: PARTS + {"parts": n, "bytes": total}
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
        self._parts: dict[str, int] = {}  # key -> parts read under it (deleted with it)

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
        payload = value.encode() if isinstance(value, str) else bytes(value)
        if len(payload) > PART_BYTES:
            count = -(-len(payload) // PART_BYTES)
            for i in range(count):
                part = f"{key}#{i}"
                self.raw.set(part, self.seal(part, payload[i * PART_BYTES : (i + 1) * PART_BYTES]))  # type: ignore[arg-type]
            payload = PARTS + json.dumps({"parts": count, "bytes": len(payload)}).encode()
        self.raw.set(key, self.seal(key, payload))  # type: ignore[arg-type]  # the store takes bytes too

    def get(self, key: str) -> bytes:
        return self._verified(key)[1]

    def _verified(self, key: str) -> tuple[bytes, bytes]:
        """The raw value at ``key`` and its verified payload (parts joined)."""
        blob = bytes(self.raw.get(key))
        return blob, self._joined(key, blob, self.unseal(key, blob))

    def _joined(self, key: str, blob: bytes, payload: bytes) -> bytes:
        """``payload`` itself, or the parts it indexes joined (each verified under its own key)."""
        if not payload.startswith(PARTS):
            return payload
        try:
            index = json.loads(payload[len(PARTS):])
            count, total = int(index["parts"]), int(index["bytes"])
        except (ValueError, KeyError, TypeError):
            self.reject(key, blob, "malformed part index")
        if not 0 < count <= MAX_MESSAGE_BYTES // PART_BYTES + 1 or not 0 < total <= MAX_MESSAGE_BYTES:
            self.reject(key, blob, f"{count} parts of {total} bytes (limit {MAX_MESSAGE_BYTES})")
        self._parts[key] = count
        joined = b"".join(self.unseal(f"{key}#{i}", bytes(self.raw.get(f"{key}#{i}"))) for i in range(count))
        if len(joined) != total:
            self.reject(key, blob, f"parts hold {len(joined)} bytes, the index says {total}")
        return joined

    def read(self, key: str, parse: Callable[[bytes], T]) -> T:
        """``parse`` of the verified payload at ``key``; a payload ``parse`` rejects (it raises
        :class:`WorkerMessageRejected`) is logged like a bad signature."""
        blob, payload = self._verified(key)
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

    def delete_key(self, key: str, parts: bool = False) -> bool:
        """Delete ``key``; ``parts``: a key that may hold a value in parts deletes them too (those this
        side read, else as many as are there)."""
        known = self._parts.pop(key, None)
        if parts:
            if known is not None:
                for i in range(known):
                    self.raw.delete_key(f"{key}#{i}")
            else:  # never read (a step rolled back after its exit wrote): look
                i = 0
                while self.raw.delete_key(f"{key}#{i}"):
                    i += 1
        return bool(self.raw.delete_key(key))
