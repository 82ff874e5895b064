"""TokenBytes: the raw bytes one token stands for, as logprobs report them (``bytes``).

Decoding a single token as text loses bytes: a byte-level BPE token holding the first byte of
``"é"`` decodes to U+FFFD, whose UTF-8 is three other bytes. OpenAI's ``bytes`` field is the
token's own bytes, so that a client can join the bytes of consecutive tokens and decode them.

* byte-level BPE (GPT-2, Llama 3, Qwen; every GGUF BPE vocabulary): each character of the
  vocabulary spelling stands for one byte (GPT-2's printable byte alphabet), mapped back;
* SentencePiece-style vocabularies: ``<0xE4>`` byte-fallback pieces are that byte, ``▁`` a space;
* added tokens (``<|im_end|>``, ``<tool_call>``): the UTF-8 of their text.
"""

from __future__ import annotations

import json
import re
from functools import cache

from tokenizers import Tokenizer as BackendTokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's ``bytes_to_unicode``, inverted: printable character → the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _decoder_types(backend: BackendTokenizer) -> set[str]:
    """The decoder's component types (``ByteLevel``, ``ByteFallback``, ``Replace``, ...)."""
    decoder = backend.decoder
    if decoder is None:
        return set()
    state = json.loads(decoder.__getstate__())
    parts = state.get("decoders", [state]) if state.get("type") == "Sequence" else [state]
    return {str(part.get("type")) for part in parts}


class TokenBytes:
    """Raw bytes per token id of one tokenizer (computed on first use, then cached)."""

    def __init__(self, backend: BackendTokenizer) -> None:
        self._backend = backend
        self._cache: dict[int, bytes] = {}
        self._byte_level = self._byte_fallback = False
        self._added: dict[int, str] | None = None  # read on first use

    def _added_tokens(self) -> dict[int, str]:
        if self._added is None:
            kinds = _decoder_types(self._backend)
            self._byte_level = "ByteLevel" in kinds
            self._byte_fallback = "ByteFallback" in kinds
            self._added = {i: t.content for i, t in self._backend.get_added_tokens_decoder().items()}
        return self._added

    def __call__(self, token_id: int) -> bytes:
        """The bytes of ``token_id``; ``b""`` for an id the vocabulary does not name."""
        found = self._cache.get(token_id)
        if found is None:
            found = self._cache[token_id] = self._compute(token_id)
        return found

    def _compute(self, token_id: int) -> bytes:
        added = self._added_tokens()
        if token_id in added:
            return added[token_id].encode()
        piece = self._backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level:
            alphabet = _byte_level_alphabet()
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        if self._byte_fallback and (byte := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(byte.group(1), 16)])
        return piece.replace("▁", " ").encode()
