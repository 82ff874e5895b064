"""StagingArea: the sequences a batcher prefills together, in contiguous state rows.

Several new sequences' prompts are prefilled in one step (chunked prefill under a token budget,
as vLLM's ``max_num_batched_tokens``): the step is a rectangle of ``k`` rows of ``T`` tokens, so
every member runs exactly ``T`` real tokens (no padding: a padding token would change a
linear-attention row's recurrent state) and ``k * T <= budget_tokens``.

Members sit in rows ``first .. first + k - 1`` ordered by the prompt tokens they have left, fewest
at the bottom; a step runs ``T = min(fewest left, budget // k)`` tokens of each, so the members that
finish are always the bottom rows and join the decoding rows just below without disturbing the
rest. A new member enters at the top only if it leaves no fewer tokens than the top member (the
order holds) and only while it raises the step's tokens ``k * T``. The newest member is the top
row: preempting it keeps the rows contiguous. Pure bookkeeping: the batcher moves the rows.

``packed`` (a pipeline that takes packed steps, :class:`~stagewise.models.step_layout.StepLayout`):
no rectangle. A step gives the members its budget first come, first served, bottom row first
(:meth:`chunks`): each runs all its tokens left or what remains of the budget, so every step but a
prompt's last is full, and the members a step finishes are again the bottom rows (a member that
does not finish takes the rest of the budget; those above it run nothing). A new member enters at
the top while the members' tokens left do not fill one step's budget.
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
    """Members in row order from ``first`` (bottom: fewest tokens left, or oldest when ``packed``);
    ``budget_tokens`` per step."""

    budget_tokens: int
    first: int = 0
    members: list[S] = field(default_factory=list)
    packed: bool = False

    def __post_init__(self) -> None:
        if self.budget_tokens < 1:
            raise ValueError(f"the prefill budget must be at least one token, got {self.budget_tokens}")

    @property
    def end(self) -> int:
        """One past the top member's row."""
        return self.first + len(self.members)

    @property
    def rows(self) -> slice:
        return slice(self.first, self.end)

    def step_tokens(self) -> int:
        """Tokens every member runs in the next (rectangle) step (0 with no members)."""
        if not self.members:
            return 0
        return max(1, min(tokens_left(self.members[0]), self.budget_tokens // len(self.members)))

    def accepts(self, left: int) -> bool:
        """Whether a sequence with ``left`` prompt tokens may enter at the top: a rectangle's order kept
        and its step's tokens raised; packed, while the members' tokens left do not fill a step."""
        if not self.members:
            return True
        if self.packed:
            return sum(tokens_left(seq) for seq in self.members) < self.budget_tokens
        if left < tokens_left(self.members[-1]):
            return False
        count = len(self.members)
        now = count * self.step_tokens()
        after = (count + 1) * min(tokens_left(self.members[0]), self.budget_tokens // (count + 1))
        return after > now

    def chunks(self, budget_tokens: int) -> list[int]:
        """A packed step's tokens of each member, bottom first, within ``budget_tokens`` (first come,
        first served: a prefix of the members runs all it has left, the next the rest of the budget)."""
        out = []
        for seq in self.members:
            take = min(tokens_left(seq), budget_tokens)
            out.append(take)
            budget_tokens -= take
        return out

    def add(self, seq: S) -> int:
        """Put ``seq`` at the top; returns its row."""
        if not self.accepts(tokens_left(seq)):
            raise ValueError("the sequence would break the staging rows' order or shrink the step")
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
