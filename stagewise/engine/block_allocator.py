"""BlockAllocator: the pipeline's free KV blocks, handed to sequences a block at a time.

One allocator for the whole pipeline: every stage's pool has the same blocks and every stage's
block table the same rows, so an id names the same block everywhere (a staged pipeline and a
single device compute on the same layout). The batcher owns it and never lets a block belong to
two sequences; a sequence's blocks come back when it ends or is preempted.
"""

from __future__ import annotations

from collections import deque

from stagewise.spec.kv_pool import KVPool, blocks_for


class OutOfBlocks(RuntimeError):
    """Asked for more blocks than are free (the batcher checks first; this is a bug if it escapes)."""


class BlockAllocator:
    """Free list over ``pool.blocks`` ids, first freed first reused (FIFO, as vLLM's free queue)."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self._free: deque[int] = deque(range(pool.blocks))
        self._used: set[int] = set()

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return len(self._used)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` positions."""
        return blocks_for(tokens, self.pool.block_tokens)

    def allocate(self, count: int) -> list[int]:
        """``count`` free block ids (raises :class:`OutOfBlocks` when fewer are free)."""
        if count > len(self._free):
            raise OutOfBlocks(f"{count} KV blocks asked, {len(self._free)} of {self.pool.blocks} free")
        ids = [self._free.popleft() for _ in range(count)]
        self._used.update(ids)
        return ids

    def release(self, ids: list[int]) -> None:
        """Give ``ids`` back (each must be in use: a double free is a bug)."""
        for block in ids:
            if block not in self._used:
                raise ValueError(f"KV block {block} released but not in use")
            self._used.remove(block)
            self._free.append(block)
