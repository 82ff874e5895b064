"""MessageSeal: every control-plane message signed with the workers' shared secret, and checked.

A sealed message is ``MAGIC + HMAC-SHA256 + body`` where ``body`` is the MessagePack encoding of one
:mod:`~stagewise.runtime.worker_messages` struct and the MAC covers the pool's session nonce and
``body``, keyed by the shared secret (:mod:`stagewise.runtime.worker_secret`). :meth:`MessageSeal.open`
raises :class:`WorkerMessageRejected` for an oversized, unsigned, forged (another secret, another
session, a flipped bit) or malformed message (msgspec validates types, ranges and each message's
invariants while decoding), and logs one line per rejected message: the caller applies nothing.

Replays of a genuine message within the session are refused by the receivers, which know what they
expect next: a command's ``seq`` (strictly in order), an acknowledgement's ``seq`` and rank (once,
while awaited), a heartbeat's ``n`` (increasing), a join's incarnation (never admitted before).
Values are authenticated, not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from stagewise.errors import WorkerMessageRejected

MAGIC = b"SWZ1"
MAC_BYTES = 32
MAX_MESSAGE_BYTES = 1 << 30  # the largest message read at all (an exit's logits for a long prefill chunk)
T = TypeVar("T")


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class MessageSeal(Generic[T]):
    """Seals outgoing messages and opens incoming ones of type ``kind`` (a struct or tagged union).

    ``who`` names this side in log lines (``coordinator``, ``worker 2``)."""

    def __init__(self, secret: bytes, session: str, kind: Any, who: str,
                 log: Callable[[str], None] = stderr_log) -> None:
        self._secret = secret
        self._prefix = b"stagewise-plane-v1\0" + session.encode() + b"\0"
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[T] = msgspec.msgpack.Decoder(kind)
        self.who = who
        self._log = log
        self._reported: set[bytes] = set()
        self.rejected = 0  # messages refused so far

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, self._prefix + body, hashlib.sha256).digest()

    def seal(self, message: msgspec.Struct) -> bytes:
        body = self._encoder.encode(message)
        return MAGIC + self._mac(body) + body

    def open(self, blob: bytes) -> T:
        """The message in ``blob``; :class:`WorkerMessageRejected` unless it is signed with this
        session's secret and decodes to a valid ``kind``."""
        if len(blob) > MAX_MESSAGE_BYTES + len(MAGIC) + MAC_BYTES:
            self.reject(blob, f"{len(blob)} bytes (limit {MAX_MESSAGE_BYTES})")
        if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + MAC_BYTES:
            self.reject(blob, "unsigned")
        mac, body = blob[len(MAGIC) : len(MAGIC) + MAC_BYTES], blob[len(MAGIC) + MAC_BYTES :]
        if not hmac.compare_digest(mac, self._mac(body)):
            self.reject(blob, "bad signature (another secret, another session or a changed message)")
        try:
            return self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.reject(blob, f"malformed ({exc})")
        raise AssertionError("unreachable")  # reject raises

    def reject(self, blob: bytes, why: str) -> None:
        """Log (once per distinct message) and raise :class:`WorkerMessageRejected`."""
        message = f"rejected a message: {why}"[:300]
        self.rejected += 1
        digest = hashlib.sha256(blob).digest()
        if digest not in self._reported:
            if len(self._reported) > 10_000:
                self._reported.clear()
            self._reported.add(digest)
            self._log(f"stagewise {self.who}: {message}")
        raise WorkerMessageRejected(message)
