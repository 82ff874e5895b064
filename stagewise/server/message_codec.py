"""MessageCodec: the engine-process messages to bytes and back, refusing anything malformed.

msgspec checks every field's type while decoding; the checks that types cannot say (a finish
reason, an error class) are :func:`error_of`'s and the records' converters'. A message that fails
any check raises :class:`EngineMessageRejected`; the caller drops it (nothing of it is applied).
"""

from __future__ import annotations

import msgspec

from stagewise.engine.scheduler import EngineClosed, QueueFull
from stagewise.errors import EngineMessageRejected, StagewiseError
from stagewise.server.engine_messages import ErrorRecord, FromEngine, ToEngine
from stagewise.server.openai_errors import InvalidParam

_KEEP_IMPORTED = (EngineClosed, QueueFull, InvalidParam)  # errors that cross: defined outside stagewise.errors


class MessageCodec:
    """Encodes either direction's messages; decodes one direction's (``ToEngine`` or ``FromEngine``)."""

    def __init__(self, incoming: type[ToEngine] | type[FromEngine]) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(incoming)  # type: ignore[arg-type]

    def encode(self, message: ToEngine | FromEngine) -> bytes:
        return self._encoder.encode(message)

    def decode(self, data: bytes) -> ToEngine | FromEngine:
        """The message in ``data``; :class:`EngineMessageRejected` naming what is wrong otherwise."""
        try:
            message: ToEngine | FromEngine = self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise EngineMessageRejected(f"malformed engine message ({len(data)} bytes): {exc}") from exc
        return message


def to_engine_codec() -> MessageCodec:
    return MessageCodec(ToEngine)  # type: ignore[arg-type]


def from_engine_codec() -> MessageCodec:
    return MessageCodec(FromEngine)  # type: ignore[arg-type]


def _known_errors() -> dict[str, type[StagewiseError]]:
    """Every typed error class by name (they are defined once each: names are unique)."""
    found: dict[str, type[StagewiseError]] = {}
    pending: list[type[StagewiseError]] = [StagewiseError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


def error_record(error: StagewiseError) -> ErrorRecord:
    code = error.code if error.code != type(error).code else None
    return ErrorRecord(type(error).__name__, str(error), getattr(error, "param", None), code)


def error_of(record: ErrorRecord) -> StagewiseError:
    """The typed error ``record`` names; :class:`EngineMessageRejected` for a class this process does not know."""
    cls = _known_errors().get(record.kind)
    if cls is None:
        raise EngineMessageRejected(f"engine message names an unknown error class {record.kind!r}")
    error = cls(record.message)
    if record.param is not None:
        error.param = record.param  # type: ignore[attr-defined]
    if record.code is not None:
        error.code = record.code
    return error
