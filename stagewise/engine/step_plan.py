"""StepPlan and DecodePlan: what one step runs, decided on host integers only (no tensors).

Given the decoding rows of the group the step carries and the staging rows (a packed
:class:`StagingArea`), :func:`plan_packed_step` decides the step within its token budget: every
decoding row's next token, then each staging row's next chunk first come, first served with what
the decoding rows leave of the budget (at least one aligned chunk, a KV block, so prompts never
starve: a step crowded by decoding rows may exceed the budget by less than a block), and which
segments need logits: every decoding row's, and a prompt's whose last chunk this is unless it was
recomputed after a preemption (it has its next token already). :func:`plan_decode_step` decides a
decode group's plain step (its rows, padding rows included, each one's input token and position).
The scheduler emits one of the two records per step; the batcher's runner turns it into tensors,
submits it and samples (vLLM v1's ``SchedulerOutput`` → model runner).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from stagewise.engine.staging_area import StagingArea
from stagewise.models.step_layout import StepLayout


class Decoding(Protocol):
    """What the plan reads of a decoding sequence: its row, positions so far and next input token."""

    @property
    def row(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def next_token(self) -> int: ...

    @property
    def device_greedy(self) -> bool: ...


class Staged(Protocol):
    """What the plan reads of a staging sequence: its row, what it prefills and has run, and the tokens
    it already sampled (a recomputed sequence's)."""

    @property
    def row(self) -> int: ...

    @property
    def ids(self) -> tuple[int, ...]: ...

    @property
    def prefilled(self) -> int: ...

    @property
    def tokens(self) -> list[int]: ...

    @property
    def device_greedy(self) -> bool: ...


T = TypeVar("T", bound=Staged)


@dataclass(frozen=True)
class StepPlan:
    """One packed step: ``layout`` (segments: the decoding rows, then the prompt chunks) and its
    ``token_ids`` in column order; ``members``: the staging members (indices into the area, bottom
    first) whose chunks run, ``chunks`` their tokens; ``sampled``: the members whose first token the
    step's logits give (after the decoding rows' logits, in this order); ``greedy``: every row the
    logits give is sampled greedily on the device (two numbers a row come back)."""

    layout: StepLayout
    token_ids: tuple[int, ...]
    members: tuple[int, ...]
    chunks: tuple[int, ...]
    sampled: tuple[int, ...]
    greedy: bool = False

    def __post_init__(self) -> None:
        if len(self.token_ids) != self.layout.tokens:
            raise ValueError(f"{len(self.token_ids)} token ids for a step of {self.layout.tokens} tokens")
        if len(self.members) != len(self.chunks) or len(self.members) != len(self.layout.rows) - self.layout.decoding:
            raise ValueError("one chunk per member, one segment per decoding row and per member")
        if len(self.layout.logits) != self.layout.decoding + len(self.sampled) or not set(self.sampled) <= set(self.members):
            raise ValueError("logits for every decoding row and every sampled member, of members that run")

    @property
    def decoding(self) -> int:
        """Decoding rows the step carries (its first segments)."""
        return self.layout.decoding


def plan_packed_step(decoding: Sequence[Decoding], area: StagingArea[T], budget_tokens: int) -> StepPlan | None:
    """The packed step of ``decoding`` rows and ``area``'s next chunks within ``budget_tokens`` (module
    doc); None when there is nothing to run."""
    room = max(area.align_tokens, budget_tokens - len(decoding))  # a prompt always advances by a block
    members: list[int] = []
    chunks: list[int] = []
    for i, take in enumerate(area.chunks(room)):
        if take:
            members.append(i)
            chunks.append(take)
    if not decoding and not members:
        return None
    staged = [area.members[i] for i in members]
    sampled = tuple(i for i, seq, take in zip(members, staged, chunks, strict=True)
                    if seq.prefilled + take >= len(seq.ids) and not seq.tokens)
    segment = {i: len(decoding) + k for k, i in enumerate(members)}
    layout = StepLayout(rows=tuple(s.row for s in decoding) + tuple(s.row for s in staged),
                        starts=tuple(s.length for s in decoding) + tuple(s.prefilled for s in staged),
                        lengths=(1,) * len(decoding) + tuple(chunks),
                        logits=tuple(range(len(decoding))) + tuple(segment[i] for i in sampled),
                        decoding=len(decoding))
    ids = [s.next_token for s in decoding]
    for seq, take in zip(staged, chunks, strict=True):
        ids.extend(seq.ids[seq.prefilled : seq.prefilled + take])
    greedy = bool(decoding or sampled) and all(s.device_greedy for s in decoding) and all(
        area.members[i].device_greedy for i in sampled)
    return StepPlan(layout, tuple(ids), tuple(members), tuple(chunks), sampled, greedy)


@dataclass(frozen=True)
class DecodePlan:
    """A decode group's plain step: rows ``first_row ..`` (``len(live)`` of them, padding rows to the
    graph bucket included), each live row's input token (its last sampled one) and position; padding
    rows run token 0 at position 0 and are never read. ``greedy``: every live row samples greedily on
    the device, so the step's greedy tokens may feed the group's next step where they were sampled."""

    group: int
    first_row: int
    live: tuple[bool, ...]
    token_ids: tuple[int, ...]
    positions: tuple[int, ...]
    greedy: bool

    def __post_init__(self) -> None:
        if not len(self.live) == len(self.token_ids) == len(self.positions) or not any(self.live):
            raise ValueError("one token and one position per row, and at least one live row")

    @property
    def rows(self) -> int:
        """Rows the step runs (padding included)."""
        return len(self.live)


def plan_decode_step(group: int, first_row: int, rows: Sequence[Decoding | None]) -> DecodePlan | None:
    """Group ``group``'s step over ``rows`` (from ``first_row``; None: a hole or padding); None when no
    row is live."""
    if not any(rows):
        return None
    return DecodePlan(group, first_row, tuple(s is not None for s in rows),
                      tuple(s.next_token if s else 0 for s in rows), tuple(s.length if s else 0 for s in rows),
                      all(s is None or s.device_greedy for s in rows))
