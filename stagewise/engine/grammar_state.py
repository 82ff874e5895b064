"""GrammarState: one sequence's position in a :class:`~stagewise.engine.grammar.Grammar`.

Its :class:`~stagewise.engine.sampling.Sampler` asks it which tokens are allowed before each draw
(:meth:`GrammarState.allowed`) and advances it with the token drawn (:meth:`GrammarState.advance`).
Once the grammar is complete, only end-of-sequence ids are allowed; a token outside the grammar is a
:class:`StepFailed` (a bug: the mask forbids it).
"""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from stagewise.engine.grammar import Grammar, library_message
from stagewise.errors import StepFailed


class GrammarState:
    """One sequence's position in ``grammar``, at its start when made (mutable; used by one sampler)."""

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
