"""The engine's tokenizer: text ↔ ids, special ids, and the model's chat template.

Wraps a `tokenizers.Tokenizer` built from a Hugging Face directory (:meth:`Tokenizer.from_dir`)
or from GGUF metadata (:meth:`Tokenizer.from_gguf_fields`). Encoding matches
`transformers.AutoTokenizer` loaded from the same files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer

from stagewise.engine.token_bytes import TokenBytes
from stagewise.engine.tokenizer_files import read_tokenizer_dir
from stagewise.engine.tokenizer_stream import IncrementalDecoder
from stagewise.weights.tokenizer_gguf import tokenizer_from_gguf_fields


class Tokenizer:
    """Text ↔ token ids for one model.

    Invariants: every id in ``eos_token_ids`` (and ``bos_token_id`` / ``pad_token_id`` when set)
    is below ``vocab_size``; ``eos_token_id``, when set, is in ``eos_token_ids``.
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
        pad_token_id: int | None = None,
        unk_token_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        """``eos_token_id`` is the EOS a chat template writes; ``eos_token_ids`` every id that ends generation."""
        self._backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids) | (
            {eos_token_id} if eos_token_id is not None else frozenset()
        )
        self.pad_token_id = pad_token_id
        self.unk_token_id = unk_token_id
        self.chat_template = chat_template
        self._token_bytes = TokenBytes(backend)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json (+ tokenizer_config.json, chat_template.jinja, generation_config.json) from ``path``.

        Raises ModelNotFound / CorruptModelFile / ConfigError naming the file at fault.
        """
        files = read_tokenizer_dir(path)
        backend = files.backend
        ids = {name: backend.token_to_id(text) for name, text in files.special_tokens_map.items()}
        return cls(
            backend,
            bos_token_id=ids.get("bos_token"),
            eos_token_id=ids.get("eos_token"),
            eos_token_ids=files.generation_eos_ids,
            pad_token_id=ids.get("pad_token"),
            unk_token_id=ids.get("unk_token"),
            chat_template=files.chat_template,
        )

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (key → python value), see `stagewise.weights.tokenizer_gguf`.

        Raises CorruptModelFile (missing/inconsistent field) or UnsupportedArchitecture (non-BPE vocab).
        """
        gguf = tokenizer_from_gguf_fields(fields)
        return cls(
            gguf.backend,
            bos_token_id=gguf.bos_token_id,
            eos_token_id=gguf.eos_token_id,
            eos_token_ids=gguf.eos_token_ids,
            pad_token_id=gguf.pad_token_id,
            chat_template=gguf.chat_template,
        )

    @property
    def backend(self) -> BackendTokenizer:
        """The wrapped `tokenizers.Tokenizer` (treat as read-only)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer knows, added tokens included (a model's vocab may be larger)."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """``{"bos_token": text, "eos_token": text, "pad_token": ..., "unk_token": ...}`` for the ids that are set.

        These are the variables transformers hands every chat template.
        """
        named = {
            "bos_token": self.bos_token_id,
            "eos_token": self.eos_token_id,
            "unk_token": self.unk_token_id,
            "pad_token": self.pad_token_id,
        }
        return {name: text for name, i in named.items() if i is not None and (text := self.id_to_token(i)) is not None}

    @property
    def special_token_ids(self) -> dict[str, int]:
        """Every special added token (e.g. ``<|im_end|>``) → its id."""
        decoder = self._backend.get_added_tokens_decoder()
        return {token.content: index for index, token in sorted(decoder.items()) if token.special}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``. Special-token text in ``text`` (e.g. ``<|im_start|>``) becomes its id, as in
        transformers. ``add_special_tokens`` applies the post-processor (e.g. prepends BOS for Llama 3)."""
        # NOTE: encode_batch releases the GIL while it works (encode does not): a prompt of megabytes
        # takes seconds, during which the server's event loop must keep running
        return list(self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; incomplete UTF-8 sequences become U+FFFD."""
        return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        """The id of a token spelled as in the vocabulary, or None."""
        found = self._backend.token_to_id(token)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary spelling of ``token_id``, or None when out of range."""
        return self._backend.id_to_token(token_id)

    @cached_property
    def max_token_bytes(self) -> int:
        """The most bytes one token stands for (added tokens included): a text of ``b`` UTF-8 bytes has at
        least ``ceil(b / max_token_bytes)`` tokens, which bounds a prompt's length before it is tokenized."""
        return max([1, *(len(self._token_bytes(i)) for i in range(self.vocab_size))])

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes ``token_id`` stands for (a lone byte of a multi-byte character stays that byte;
        see :mod:`stagewise.engine.token_bytes`); ``b""`` for an id outside the vocabulary."""
        return self._token_bytes(token_id)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A fresh streaming detokenizer over this tokenizer."""
        return IncrementalDecoder(self._backend, skip_special_tokens=skip_special_tokens)
