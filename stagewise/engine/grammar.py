"""Grammar: a constraint on what a sequence may generate (JSON schema or Lark, compiled by llguidance),
and GrammarState, one sequence's position in it.

A :class:`Grammar` is immutable and shared by every sequence of a request; each sequence's
:class:`~stagewise.engine.sampling.Sampler` starts its own :class:`GrammarState`, asks it which
tokens are allowed before each draw (:meth:`GrammarState.allowed`) and advances it with the token
drawn (:meth:`GrammarState.advance`). Once the grammar is complete, only end-of-sequence ids are
allowed; a token outside the grammar is a :class:`StepFailed` (a bug: the mask forbids it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import llguidance
import numpy as np
import torch

from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.schema_finiteness import check_finite
from stagewise.errors import GrammarError, StepFailed

# compact, as json.dumps writes it: no free whitespace a weak model could loop in
JSON_OPTIONS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_LIBRARY_MESSAGE_CHARS = 160


def library_message(text: str) -> str:
    """The grammar library's message cut to its first line, without its parser-state dump (clients see it)."""
    line = " ".join(text.split("<state>")[0].split())
    return (line[:_LIBRARY_MESSAGE_CHARS].rstrip() + "…") if len(line) > _LIBRARY_MESSAGE_CHARS else (
        line or "invalid grammar")


@dataclass(frozen=True)
class Grammar:
    """A compiled llguidance grammar over one model's vocabulary; ``description`` names it in errors."""

    definition: str  # llguidance's grammar JSON
    description: str
    vocabulary: GrammarVocabulary = field(compare=False, repr=False)

    def __post_init__(self) -> None:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.definition,
                                                                                 self.vocabulary.backend)
        if failed:
            raise GrammarError(f"{self.description}: {library_message(messages[0] if messages else '')}")
        # NOTE: some grammars compile yet cannot start (an anyOf of only itself): probe the first mask here,
        # so they are refused before a response starts rather than failing the first engine step
        probe = llguidance.LLMatcher(self.vocabulary.backend, self.definition, log_level=0)
        if not probe.is_error():
            probe.compute_bitmask()
        if probe.is_error():
            raise GrammarError(f"{self.description}: the grammar admits no output "
                               f"({library_message(probe.get_error())})")

    @classmethod
    def json_schema(cls, schema: dict[str, Any], vocabulary: GrammarVocabulary, description: str) -> Grammar:
        """Output must be one JSON value valid under ``schema`` (compact separators ``", "`` and ``": "``).

        Raises :class:`GrammarError` (one line) for a schema the library rejects or one with no finite value."""
        check_finite(schema, description)
        try:
            definition = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
        except (ValueError, TypeError, RecursionError) as exc:
            raise GrammarError(f"{description}: {library_message(str(exc))}") from exc
        return cls(definition, description, vocabulary)

    @classmethod
    def lark(cls, text: str, vocabulary: GrammarVocabulary, description: str) -> Grammar:
        """Output must match the Lark grammar ``text`` (llguidance's dialect: ``%json {schema}`` embeds a schema)."""
        try:
            definition = llguidance.LLMatcher.grammar_from_lark(text)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"{description}: {library_message(str(exc))}") from exc
        return cls(definition, description, vocabulary)

    def start(self) -> GrammarState:
        """A fresh state at the grammar's start, for one sequence."""
        return GrammarState(self)


class GrammarState:
    """One sequence's position in a :class:`Grammar` (mutable; used by one sampler)."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._matcher = llguidance.LLMatcher(grammar.vocabulary.backend, grammar.definition, log_level=0)
        self._check()

    def allowed(self) -> torch.Tensor:
        """Boolean ``(vocab_size,)``: the tokens that keep the output inside the grammar (never empty)."""
        words = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)  # 32 ids per little-endian u32
        self._check()
        bits = np.unpackbits(words, bitorder="little")[: self.grammar.vocabulary.vocab_size]
        mask = torch.from_numpy(bits.astype(bool))
        if not bool(mask.any()):
            raise StepFailed(f"{self.grammar.description}: no token can continue the output")
        return mask

    def advance(self, token: int) -> None:
        """Move past ``token``; raises :class:`StepFailed` if the grammar does not allow it."""
        if not self._matcher.consume_token(int(token)):
            raise StepFailed(f"{self.grammar.description}: token {token} is outside the grammar "
                             f"({library_message(self._matcher.get_error())})")

    @property
    def complete(self) -> bool:
        """The output so far is a whole sentence of the grammar (end of sequence is allowed)."""
        return bool(self._matcher.is_accepting())

    def _check(self) -> None:
        if self._matcher.is_error():
            raise StepFailed(f"{self.grammar.description}: {library_message(self._matcher.get_error())}")
