"""Streaming detokenization: turn ids into text as they arrive, one complete character at a time.

In byte-level BPE a multi-byte character (``"é"``, ``"日"``, an emoji) may be split across
tokens; decoding a lone token then yields U+FFFD. :class:`IncrementalDecoder` holds such tokens
back until the character completes, so the text it yields, concatenated, equals ``decode(all_ids)``.

It decodes a short window (``ids[prefix:]`` against ``ids[prefix:read]``) rather than single tokens,
so decoders that depend on context (SentencePiece's leading space) also come out right.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"
# No UTF-8 character spans more than 4 byte tokens; past this many held-back tokens the bytes are
# genuinely invalid, and holding them longer would only stall the stream.
_MAX_PENDING_TOKENS = 8


class _Decodes(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDecoder:
    """Feed ids with :meth:`push`; each call returns the newly completed text ("" when none).

    Invariant: ``"".join(pushes) + flush() == decode(all ids)`` (for byte-level BPE).
    """

    def __init__(self, tokenizer: _Decodes, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # ids before this have been emitted

    @property
    def token_ids(self) -> list[int]:
        """Every id pushed so far (a copy)."""
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Append one id; return text that is now complete."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        pending = len(self._ids) - self._read_offset
        if len(new_text) <= len(prefix_text):
            return ""
        if new_text.endswith(_REPLACEMENT) and pending < _MAX_PENDING_TOKENS:
            return ""  # a character is still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def push_many(self, token_ids: list[int]) -> str:
        """Append several ids; return the text they complete."""
        return "".join(self.push(token_id) for token_id in token_ids)

    def flush(self) -> str:
        """End of stream: return whatever is held back (an incomplete character decodes to U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
