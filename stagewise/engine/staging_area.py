"""StagingArea: the sequences whose prompts a batcher is prefilling, in contiguous state rows.

Prompts are prefilled in packed steps (:class:`~stagewise.models.step_layout.StepLayout`; vLLM's
chunked prefill mixed with decode): a step gives the members its token budget first come, first
served, bottom row (oldest) first (:meth:`chunks`): each runs all it has left or what remains of
the budget, so every step but a prompt's last is full. A chunk that does not end its prompt ends at
an absolute multiple of ``align_tokens`` (the KV block): a prompt is then always cut at the same
positions however the budget was shared, so its results never depend on how it was split (the
chunked delta rule's chunks are the KV blocks), and a prompt resumed from the prefix cache at a
block boundary computes what an uncached one does. The members a step finishes are the bottom
rows (a member that does not finish takes the rest of the budget; those above it run nothing). A
new member enters at the top while the members' tokens left do not fill one step's budget; the
newest member is the top row, so preempting it keeps the rows contiguous. Pure bookkeeping (no
torch): the batcher moves the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Prefilling(Protocol):
    """What the area reads of a sequence: the ids it prefills and how many it has run."""

    @property
    def ids(self) -> tuple[int, ...]: ...

    @property
    def prefilled(self) -> int: ...


S = TypeVar("S", bound=Prefilling)


def tokens_left(seq: Prefilling) -> int:
    """Prompt tokens ``seq`` has still to prefill."""
    return len(seq.ids) - seq.prefilled


@dataclass
class StagingArea(Generic[S]):
    """Members in row order from ``first`` (bottom: oldest); ``budget_tokens`` per step; chunks that do
    not end a prompt end at multiples of ``align_tokens`` (1: anywhere)."""

    budget_tokens: int
    first: int = 0
    members: list[S] = field(default_factory=list)
    align_tokens: int = 1

    def __post_init__(self) -> None:
        if self.budget_tokens < 1:
            raise ValueError(f"the prefill budget must be at least one token, got {self.budget_tokens}")
        if self.align_tokens < 1 or self.align_tokens > self.budget_tokens:
            raise ValueError(f"chunks aligned to {self.align_tokens} tokens do not fit a budget of {self.budget_tokens}")

    @property
    def end(self) -> int:
        """One past the top member's row."""
        return self.first + len(self.members)

    @property
    def rows(self) -> slice:
        return slice(self.first, self.end)

    def accepts(self, left: int) -> bool:
        """Whether a sequence with ``left`` prompt tokens may enter at the top: while the members' tokens
        left do not fill a step."""
        del left  # any prompt: it takes what the members before it leave
        return sum(tokens_left(seq) for seq in self.members) < self.budget_tokens

    def chunk(self, seq: S, budget_tokens: int) -> int:
        """Tokens ``seq`` runs in a step that leaves it ``budget_tokens``: all it has left when they fit,
        else the most that end at a multiple of ``align_tokens`` (0 when none does)."""
        left = tokens_left(seq)
        if left <= budget_tokens:
            return left
        end = seq.prefilled + budget_tokens
        return max(0, end - end % self.align_tokens - seq.prefilled)

    def chunks(self, budget_tokens: int) -> list[int]:
        """A packed step's tokens of each member, bottom first, within ``budget_tokens`` (first come,
        first served: a prefix of the members runs all it has left, the next what the rest of the
        budget allows, those above it nothing)."""
        out = []
        for seq in self.members:
            take = self.chunk(seq, budget_tokens)
            out.append(take)
            budget_tokens -= take
            if take < tokens_left(seq):
                budget_tokens = 0  # the first member that does not finish ends the step
        return out

    def add(self, seq: S) -> int:
        """Put ``seq`` at the top; returns its row."""
        if not self.accepts(tokens_left(seq)):
            raise ValueError("the staging rows already fill a step")
        self.members.append(seq)
        return self.end - 1

    def finished(self) -> list[S]:
        """The bottom members with nothing left to prefill (they join the decoding rows)."""
        done = []
        for seq in self.members:
            if tokens_left(seq) > 0:
                break
            done.append(seq)
        return done
