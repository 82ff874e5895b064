"""StagingArea: packed prefill bookkeeping — the step stays within its token budget, every member runs
real tokens only, finished members are always the bottom rows, the newest is the top row."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.engine.staging_area import StagingArea, tokens_left


@dataclass
class _Seq:
    ids: tuple[int, ...]
    prefilled: int = 0


def _seq(n: int) -> _Seq:
    return _Seq(tuple(range(n)))


def test_packs_while_the_step_grows() -> None:
    area = StagingArea(512, first=3)
    for _ in range(4):  # four 128-token prompts fill the 512-token step
        assert area.accepts(128)
        area.add(_seq(128))
    assert area.step_tokens() == 128 and area.rows == slice(3, 7)
    assert not area.accepts(128)  # five would run 102 each: fewer tokens than four of 128
    assert not area.accepts(100)  # fewer left than the top member: the order would break
    with pytest.raises(ValueError, match="order"):
        area.add(_seq(100))


def test_the_shortest_sets_the_step_and_finishes_at_the_bottom() -> None:
    area = StagingArea(64)
    for n in (10, 30, 50):
        area.add(_seq(n))
    assert area.step_tokens() == 10  # min(10 left, 64 // 3)
    for seq in area.members:
        seq.prefilled += 10
    assert area.finished() == [area.members[0]]
    area.members.pop(0)
    assert area.step_tokens() == 20  # min(20 left, 64 // 2 = 32)


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budget"):
        StagingArea(0)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 96), st.lists(st.integers(1, 300), min_size=1, max_size=12))
def test_any_arrivals_prefill_completely_within_budget(budget: int, lengths: list[int]) -> None:
    """Simulate the batcher: admit in queue order while accepted, step, drop the finished bottom rows."""
    area = StagingArea(budget)
    queue = [_seq(n) for n in lengths]
    done: list[_Seq] = []
    for _ in range(10_000):
        while queue and area.accepts(tokens_left(queue[0])):
            area.add(queue.pop(0))
        if not area.members:
            break
        lefts = [tokens_left(s) for s in area.members]
        assert lefts == sorted(lefts)  # fewest left at the bottom
        steps = area.step_tokens()
        assert 1 <= steps <= min(lefts)  # every member runs real tokens only
        assert len(area.members) * steps <= max(budget, len(area.members))  # within the budget
        for seq in area.members:
            seq.prefilled += steps
        finished = area.finished()
        assert finished == area.members[: len(finished)]  # the finished are the bottom rows
        for seq in finished:
            area.members.remove(seq)
            done.append(seq)
    assert not queue and not area.members
    assert all(s.prefilled == len(s.ids) for s in done) and len(done) == len(lengths)


def test_packed_chunks_are_first_come_first_served() -> None:
    area = StagingArea(64, packed=True)
    for n in (10, 30, 50):
        assert area.accepts(n)
        area.add(_seq(n))
    assert not area.accepts(5)  # 90 tokens left: the members fill a step already
    assert area.chunks(64) == [10, 30, 24] and area.chunks(20) == [10, 10, 0]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 96), st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(0, 8))
def test_packed_arrivals_fill_every_step_but_the_last(budget: int, lengths: list[int], decoding: int) -> None:
    """Simulate the batcher's packed steps (``decoding`` rows' tokens beside): each step runs the budget
    left by the decoding rows, or every token the members have left; the finished are the bottom rows."""
    area = StagingArea(budget, packed=True)
    queue = [_seq(n) for n in lengths]
    done: list[_Seq] = []
    for _ in range(10_000):
        while queue and area.accepts(tokens_left(queue[0])):
            area.add(queue.pop(0))
        if not area.members:
            break
        room = max(1, budget - decoding)
        chunks = area.chunks(room)
        assert sum(chunks) == min(room, sum(tokens_left(s) for s in area.members))  # dense: no token idle
        running = [take for take in chunks if take]
        assert chunks[: len(running)] == running  # a bottom prefix runs
        for seq, take in zip(area.members, chunks, strict=True):
            seq.prefilled += take
        finished = area.finished()
        assert finished == area.members[: len(finished)]  # the finished are the bottom rows
        assert len(finished) >= len(running) - 1  # at most one member runs without finishing
        for seq in finished:
            area.members.remove(seq)
            done.append(seq)
    assert not queue and not area.members
    assert all(s.prefilled == len(s.ids) for s in done) and len(done) == len(lengths)
