"""StagingArea: packed prefill bookkeeping — the step stays within its token budget, chunks end on block
boundaries or at their prompt's end, finished members are always the bottom rows, the newest is the top row."""

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


def test_packed_chunks_are_first_come_first_served() -> None:
    area = StagingArea(64)
    for n in (10, 30, 50):
        assert area.accepts(n)
        area.add(_seq(n))
    assert not area.accepts(5)  # 90 tokens left: the members fill a step already
    with pytest.raises(ValueError, match="fill a step"):
        area.add(_seq(5))
    assert area.chunks(64) == [10, 30, 24] and area.chunks(20) == [10, 10, 0]


def test_chunks_that_do_not_end_a_prompt_end_on_a_block() -> None:
    long, short = _seq(1000), _seq(40)
    area = StagingArea(512, members=[long, short], align_tokens=64)
    assert area.chunks(500) == [448, 0]  # 448 = 7 blocks: the rest of the budget runs nothing
    long.prefilled = 448
    assert area.chunks(600) == [552, 40]  # the prompt's end needs no block boundary
    assert area.chunks(40) == [0, 0]  # no block fits: nothing runs (the planner gives at least a block)


def test_budget_and_alignment_must_fit() -> None:
    with pytest.raises(ValueError, match="budget"):
        StagingArea(0)
    with pytest.raises(ValueError, match="aligned"):
        StagingArea(16, align_tokens=64)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 160), st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(0, 8),
       st.sampled_from([1, 16, 64]))
def test_packed_arrivals_prefill_completely_on_block_boundaries(budget: int, lengths: list[int], decoding: int,
                                                                align: int) -> None:
    """Simulate the batcher's packed steps (``decoding`` rows' tokens beside, at least a block left to the
    prompts, as the planner does): every chunk that does not end its prompt ends at a multiple of
    ``align``; a step runs every token it may (dense up to the alignment); the finished are the bottom
    rows; everything completes."""
    align = min(align, budget)
    area = StagingArea(budget, align_tokens=align)
    queue = [_seq(n) for n in lengths]
    done: list[_Seq] = []
    for _ in range(10_000):
        while queue and area.accepts(tokens_left(queue[0])):
            area.add(queue.pop(0))
        if not area.members:
            break
        room = max(align, budget - decoding)
        chunks = area.chunks(room)
        total = sum(tokens_left(s) for s in area.members)
        assert min(room, total) - align < sum(chunks) <= min(room, total)  # dense up to the alignment
        running = [take for take in chunks if take]
        assert chunks[: len(running)] == running  # a bottom prefix runs
        for seq, take in zip(area.members, chunks, strict=True):
            seq.prefilled += take
            assert seq.prefilled == len(seq.ids) or seq.prefilled % align == 0
        finished = area.finished()
        assert finished == area.members[: len(finished)]  # the finished are the bottom rows
        assert len(finished) >= len(running) - 1  # at most one member runs without finishing
        for seq in finished:
            area.members.remove(seq)
            done.append(seq)
    assert not queue and not area.members
    assert all(s.prefilled == len(s.ids) for s in done) and len(done) == len(lengths)
