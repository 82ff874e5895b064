"""Grammar: a constraint on what a sequence may generate (JSON schema or Lark, compiled by llguidance).

A :class:`Grammar` is immutable and shared by every sequence of a request; each sequence's
:class:`~stagewise.engine.sampling.Sampler` starts its own
:class:`~stagewise.engine.grammar_state.GrammarState` over it. Compiling and validating need no
tensors: the API process compiles a request's grammar (refusing a bad one before a response starts)
without importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import llguidance

from stagewise.engine.grammar_vocabulary import GrammarVocabulary
from stagewise.engine.schema_finiteness import check_finite
from stagewise.errors import GrammarError

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
