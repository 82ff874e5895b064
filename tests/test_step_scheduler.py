"""StepScheduler's policy on plain Python objects (no torch, no pipeline): the queue's head starts
first while rows and KV blocks allow, the newest sequence is preempted when blocks run out, and
compaction fills each hole with the last live row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stagewise.engine.row_compaction import Compaction, RowMove, plan_compaction
from stagewise.engine.sequence_blocks import SequenceBlocks
from stagewise.engine.step_scheduler import StepScheduler
from stagewise.spec.kv_pool import KVPool


@dataclass
class _Request:
    prompt_ids: tuple[int, ...]
    max_tokens: int = 100


@dataclass(eq=False)
class _Seq:
    request: _Request
    row: int = -1
    length: int = 0
    tokens: list[int] = field(default_factory=list)
    ids: tuple[int, ...] = ()
    prefilled: int = 0
    blocks: list[int] = field(default_factory=list)
    admitted: int = -1
    preemptions: int = 0
    budget: int = 0
    done: bool = False
    errored: bool = False
    cached_tokens: int = 0
    restored: int = -1
    shared_tokens: int = 0
    prefix_keys: tuple[bytes, ...] = ()
    prefix_keys_of: int = -1

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def cancelled(self) -> bool:
        return False

    def on_error(self, error: Exception) -> None:
        raise AssertionError(error)


@dataclass
class _Rows:
    """The pipeline's row operations, recorded."""

    kv_pool: KVPool | None
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def reset(self, slot: int) -> None:
        self.calls.append(("reset", slot))

    def move(self, src: int, dst: int) -> None:
        self.calls.append(("move", src, dst))

    def restore(self, row: int, entry: int) -> None:
        self.calls.append(("restore", row, entry))

    def set_blocks(self, row: int, block_ids: list[int]) -> None:
        self.calls.append(("blocks", row, tuple(block_ids)))


def _scheduler(blocks: int, slots: int = 4, prefix_key: bytes | None = None) -> tuple[StepScheduler, _Rows]:
    rows = _Rows(KVPool(blocks=blocks, block_tokens=4, blocks_per_row=8))
    kv = SequenceBlocks(rows, slots, prefix_key)  # type: ignore[arg-type]
    return StepScheduler(rows, kv, slots, max_context=32, prefill_chunk=64, micro_batches=1,
                         graphs=False), rows


def _prefill_all(sched: StepScheduler) -> None:
    for seq in sched.staging:
        seq.prefilled = seq.length = len(seq.ids)
        seq.tokens.append(7)
    sched.regroup()


def test_queue_head_starts_first_and_waits_for_its_blocks() -> None:
    sched, rows = _scheduler(blocks=3)
    big, small = _Seq(_Request((1,) * 9)), _Seq(_Request((2,) * 3))  # 3 blocks, 1 block
    first = _Seq(_Request((3,) * 2))
    for seq in (first, big, small):
        sched.add(seq)  # type: ignore[arg-type]
    sched.admit()
    assert sched.staging == [first] and list(sched.queue) == [big, small]  # big's 3 blocks are not free: small waits too
    assert ("reset", 0) in rows.calls and first.blocks == [0]


def test_the_newest_sequence_is_preempted_when_blocks_run_out() -> None:
    sched, _ = _scheduler(blocks=2)
    old, new = _Seq(_Request((1,) * 4)), _Seq(_Request((2,) * 3))
    for seq in (old, new):
        sched.add(seq)  # type: ignore[arg-type]
    sched.admit()
    _prefill_all(sched)
    assert sched.decoding == [old, new] and sched.kv.exhausted
    drained: list[bool] = []
    sched.reserve_blocks(0, lambda: drained.append(True))  # old crosses a block boundary: none free
    assert drained and sched.preemptions == 1 and new.preemptions == 1
    assert list(sched.queue) == [new] and new.row == -1 and not new.blocks
    assert len(old.blocks) == 2  # old took the block new gave back
    assert sched.prefill_ids(new) == (2, 2, 2)  # recomputed: the prompt, its last token is the next input


def test_compaction_fills_each_hole_with_the_last_live_row() -> None:
    plan = plan_compaction([5, None, 7, None, 9])
    assert plan == Compaction((RowMove(4, 1, 9),), (0, 4, 2))
    assert plan_compaction([None, None]) == Compaction((), ())
    assert plan_compaction([3, None, None, 4]) == Compaction((RowMove(3, 1, 4),), (0, 3))


def test_a_cached_prefix_is_shared_and_not_prefilled_again() -> None:
    sched, rows = _scheduler(blocks=6, prefix_key=b"model")
    first = _Seq(_Request((1,) * 10))  # blocks of 4: two full, then two positions
    sched.add(first)  # type: ignore[arg-type]
    sched.admit()
    _prefill_all(sched)  # published, joins the decoding rows: its full prompt blocks are keyed
    assert sched.kv.cached_blocks == 2
    again, whole = _Seq(_Request((1,) * 9)), _Seq(_Request((1,) * 8))
    for seq in (again, whole):
        sched.add(seq)  # type: ignore[arg-type]
    sched.admit()
    assert again.prefilled == again.length == again.cached_tokens == 8 and again.blocks[:2] == first.blocks[:2]
    assert whole.cached_tokens == 4 and whole.blocks[0] == first.blocks[0]  # its last token is computed
    assert whole.blocks[1] != first.blocks[1]  # written by it alone: a shared block is never written
    assert ("blocks", again.row, tuple(again.blocks)) in rows.calls
    assert sched.kv.hit_tokens == 12 and sched.kv.queried_tokens == 10 + 9 + 8
