"""SequenceBlocks: the batcher's paged-KV bookkeeping — which blocks of the pipeline's KV pool hold
each sequence's positions, and the pipeline block-table rows that name them.

One :class:`BlockAllocator` hands out block ids, the same on every stage. A sequence gets its prefill's
blocks when it starts (:meth:`assign_prompt`), one more each time it crosses a block boundary while
decoding (:meth:`grant_next`), and gives them all back when it ends or is preempted (:meth:`release`),
its table row then pointing at the scratch block (padding steps in a free row write there). What to
do when no block is free (preempt the newest sequence) is the scheduler's policy, not this book's.
A pipeline without a KV pool keeps every row's whole context: every method is then a no-op or
answers as if blocks were unlimited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stagewise.engine.block_allocator import BlockAllocator
from stagewise.errors import ContextLengthExceeded, StagewiseError

if TYPE_CHECKING:
    from stagewise.engine.sequence import Sequence
    from stagewise.runtime.executor import Executor


class SequenceBlocks:
    """The KV blocks of the sequences on ``pipeline``'s ``rows`` state rows (module doc)."""

    def __init__(self, pipeline: Executor, rows: int) -> None:
        self.pipeline = pipeline
        self.rows = rows
        self.pool = pipeline.kv_pool
        self.allocator = BlockAllocator(self.pool) if self.pool is not None else None

    def clear(self) -> None:
        """Every block free and every row without blocks (the pipeline's identity table is not ours)."""
        if self.pool is not None:
            self.allocator = BlockAllocator(self.pool)
            for row in range(self.rows):
                self.unassign(row)

    def unassign(self, row: int) -> None:
        """Point ``row``'s block-table row at the scratch block."""
        try:
            self.pipeline.set_blocks(row, [])
        except StagewiseError:
            # NOTE: a pipeline that refuses (a lost worker) keeps the stale row; harmless: a row is given
            # its blocks before it is stepped or moved onto, and without graphs no step pads with it
            pass

    @property
    def used_blocks(self) -> int:
        """Blocks held by live sequences (0 without a pool)."""
        return self.allocator.used_blocks if self.allocator is not None else 0

    @property
    def exhausted(self) -> bool:
        """No block is free (never without a pool)."""
        return self.allocator is not None and self.allocator.free_blocks == 0

    def sequence_tokens(self, max_context: int) -> int:
        """Positions one sequence may use: the context, and never more than the whole pool."""
        return max_context if self.pool is None else min(max_context, self.pool.tokens)

    def check_prompt(self, tokens: int) -> None:
        """Raise :class:`ContextLengthExceeded` when a prompt of ``tokens`` can never fit the pool."""
        if self.pool is not None and tokens >= self.pool.tokens:
            need = -(-tokens // self.pool.block_tokens)
            raise ContextLengthExceeded(f"the prompt has {tokens} tokens ({need} KV blocks of {self.pool.block_tokens}); "
                                        f"the KV pool holds {self.pool.blocks} blocks ({self.pool.tokens} tokens, --kv-tokens)")

    def fits(self, tokens: int) -> bool:
        """Whether the blocks of ``tokens`` positions are free now."""
        return self.allocator is None or self.allocator.blocks_for(tokens) <= self.allocator.free_blocks

    def assign_prompt(self, seq: Sequence) -> None:
        """Give ``seq`` the blocks of its prefill (``seq.ids``); :meth:`name_blocks` puts them in its row."""
        if self.allocator is not None:
            seq.blocks = self.allocator.allocate(self.allocator.blocks_for(len(seq.ids)))

    def name_blocks(self, seq: Sequence) -> None:
        """Write ``seq``'s blocks into its block-table row (may raise: a lost worker refuses it)."""
        if self.allocator is not None:
            self.pipeline.set_blocks(seq.row, seq.blocks)

    def needs_block(self, seq: Sequence) -> bool:
        """Whether ``seq``'s next position lies past the blocks it holds."""
        return self.pool is not None and seq.length >= len(seq.blocks) * self.pool.block_tokens

    def grant_next(self, seq: Sequence) -> None:
        """One more block for ``seq`` (one must be free), written into its row."""
        assert self.allocator is not None
        seq.blocks += self.allocator.allocate(1)
        self.pipeline.set_blocks(seq.row, seq.blocks)

    def release(self, seq: Sequence) -> None:
        """``seq``'s blocks back to the pool, its row to the scratch block."""
        if self.allocator is not None and seq.blocks:
            self.allocator.release(seq.blocks)
            seq.blocks = []
            self.unassign(seq.row)
