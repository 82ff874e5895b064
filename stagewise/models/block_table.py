"""BlockTable: where each state row's KV positions live in its stage's block pool.

One table per stage, shared by every attention block of the stage: ``table`` ``(rows,
blocks_per_row)`` int32 on the stage's device. Position ``p`` of row ``r`` is stored in block
``table[r, p // block_tokens]`` at offset ``p % block_tokens``. The tensor has a static address (CUDA
graphs read it): it is only ever updated in place, in stream order with the steps. Entries a row has
not been given point at the scratch block (``scratch``, the pool's last), which padding rows write
and nothing attends. The engine's allocator decides the ids; every stage holds the same table.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, SCRATCH_BLOCKS, blocks_for


class BlockTable:
    """Block ids of ``rows`` rows of up to ``max_context`` positions, over a pool of ``num_blocks``
    usable blocks (+ the scratch block). A pool that covers every row's context starts as the
    identity table (row ``r`` owns blocks ``r·blocks_per_row ..``), so a caller that never assigns
    blocks (one sequence, a worker's stage) computes as with a dense per-row cache."""

    def __init__(self, rows: int, max_context: int, num_blocks: int, device: torch.device,
                 block_tokens: int = KV_BLOCK_TOKENS) -> None:
        if block_tokens < 16 or block_tokens & (block_tokens - 1):
            raise ValueError(f"block_tokens must be a power of two >= 16, got {block_tokens}")
        self.rows = rows
        self.block_tokens = block_tokens
        self.blocks_per_row = blocks_for(max_context, block_tokens)
        self.num_blocks = num_blocks  # usable blocks: ids 0 .. num_blocks - 1
        self.scratch = num_blocks  # the scratch block's id
        self.device = device
        self.table = torch.full((rows, self.blocks_per_row), self.scratch, dtype=torch.int32, device=device)
        if device.type != "meta" and num_blocks >= rows * self.blocks_per_row:
            self.table.copy_(torch.arange(rows * self.blocks_per_row, dtype=torch.int32).view(rows, -1))

    @property
    def pool_blocks(self) -> int:
        """Blocks the pool tensors hold: the usable ones and the scratch block."""
        return self.num_blocks + SCRATCH_BLOCKS

    def set_row(self, row: int, block_ids: Sequence[int]) -> None:
        """Give ``row`` the blocks ``block_ids`` (in position order); its other entries point at scratch."""
        if len(block_ids) > self.blocks_per_row:
            raise ValueError(f"row {row}: {len(block_ids)} blocks, at most {self.blocks_per_row} fit a row")
        if any(not 0 <= b < self.num_blocks for b in block_ids):
            raise ValueError(f"row {row}: block ids must be in 0..{self.num_blocks - 1}, got {list(block_ids)}")
        host = torch.full((self.blocks_per_row,), self.scratch, dtype=torch.int32)
        host[: len(block_ids)] = torch.tensor(list(block_ids), dtype=torch.int32)
        if self.device.type == "cuda":
            host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
        self.table[row].copy_(host, non_blocking=True)  # in stream order: no host sync

    def move(self, src: int, dst: int) -> None:
        """Row ``dst`` takes row ``src``'s blocks; ``src`` is left with none (scratch)."""
        if src != dst:
            self.table[dst].copy_(self.table[src])
            self.table[src].fill_(self.scratch)

    def slots(self, positions: torch.Tensor, rows: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ids and offsets ``(B, T)`` (int64) of ``positions`` ``(B, T)`` of ``rows`` (a span, or
        the state row of each of the ``B`` ``(B,)``)."""
        blocks = self.table[rows].gather(1, positions // self.block_tokens).long()
        return blocks, positions % self.block_tokens

    def row_blocks(self, rows: slice | torch.Tensor, length: int) -> torch.Tensor:
        """Block ids ``(B, ceil(length / block_tokens))`` (int64) covering ``rows``' (a span, or state rows
        ``(B,)``) first ``length`` positions."""
        return self.table[rows, : blocks_for(length, self.block_tokens)].long()

    def host_row(self, row: int) -> list[int]:
        """Row ``row``'s entries (for tests and checks; synchronizes)."""
        return [int(b) for b in self.table[row].tolist()]
