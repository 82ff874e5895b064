"""GrammarVocabulary: one model's tokens as the grammar library (llguidance) sees them, built once per model.

llguidance reads the Hugging Face ``tokenizer.json`` of the model (byte-level BPE and byte-fallback
vocabularies) and computes, for a grammar state, the set of token ids that keep the output inside
the grammar. The vocabulary covers every row of the model's logits (``vocab_size`` may exceed the
tokenizer's; the extra ids are never allowed) and treats every stop id as end of sequence, allowed
only where the grammar is complete.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import llguidance

from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import GrammarError

_CACHE: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, tuple[int, ...]], GrammarVocabulary]] = (
    weakref.WeakKeyDictionary())
_LOCK = threading.Lock()


@dataclass(frozen=True)
class GrammarVocabulary:
    """llguidance's tokenizer over ``vocab_size`` ids (the model's logits), with ``stop_ids`` as end of sequence."""

    vocab_size: int
    stop_ids: tuple[int, ...]
    backend: Any = field(compare=False, repr=False)  # llguidance.LLTokenizer

    @classmethod
    def of(cls, tokenizer: Tokenizer, vocab_size: int, stop_ids: frozenset[int]) -> GrammarVocabulary:
        """The (cached) vocabulary of ``tokenizer`` for a model with ``vocab_size`` logits.

        Raises :class:`GrammarError` when llguidance cannot read the tokenizer (~1 s for 150k tokens, once)."""
        key = (vocab_size, tuple(sorted(stop_ids)))
        with _LOCK:
            per_tokenizer = _CACHE.setdefault(tokenizer, {})
            found = per_tokenizer.get(key)
            if found is None:
                if not stop_ids:
                    raise GrammarError("structured output needs the model's end-of-sequence token; it has none")
                try:
                    backend = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size,
                                                     eos_token=list(key[1]))
                except Exception as exc:  # the library's own error types
                    raise GrammarError(f"structured output is not supported for this model's tokenizer: {exc}") from exc
                found = per_tokenizer[key] = cls(vocab_size, key[1], backend)
            return found
