"""KVCache: one attention block's keys and values, paged through the stage's :class:`BlockTable`.

Writes are provisional by position: positions past a sequence's accepted length are ignored by the
causal mask until the pipeline accepts them, so publish and rollback need no copy.
"""

from __future__ import annotations

import torch

from stagewise.models.block_table import BlockTable


class KVCache:
    """Keys and values of one attention block, paged: ``(pool_blocks, kv_heads, block_tokens, head_dim)``
    each, addressed through the stage's shared :class:`BlockTable` (position ``p`` of row ``r`` in block
    ``table[r, p // block_tokens]``, offset ``p % block_tokens``)."""

    def __init__(self, table: BlockTable, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (table.pool_blocks, kv_heads, table.block_tokens, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.table = table

    def write(self, positions: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int | None,
              rows: slice | torch.Tensor) -> None:
        """Store ``key``/``value`` ``(B, kvH, T, D)`` of ``rows`` (a span, or each batch row's state row
        ``(B,)``) at ``positions`` ``(B, T)``, through the table
        (``start``, the common first position when there is one, is not needed: every write scatters)."""
        blocks, offsets = self.table.slots(positions, rows)  # (B, T) each
        self.key[blocks, :, offsets] = key.transpose(1, 2)  # (B, T, kvH, D)
        self.value[blocks, :, offsets] = value.transpose(1, 2)

    def view(self, rows: slice | torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``rows``' (a span, or state rows ``(B,)``) first ``length`` positions, gathered from their blocks:
        ``(B, kvH, length, D)`` (a copy, laid out as a dense per-row cache would be)."""
        blocks = self.table.row_blocks(rows, length)  # (B, nb)
        return self._gather(self.key, blocks, length), self._gather(self.value, blocks, length)

    @staticmethod
    def _gather(pool: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
        batch, nb = blocks.shape
        _, kv_heads, block_tokens, dim = pool.shape
        # one copy: gather along the block dim of a head-major view, so each head's positions come out
        # consecutive; the result is (B, kvH, L, D) with D and L contiguous (batch and head strides swapped)
        if pool.device.type == "cpu":
            # NOTE: on the CPU, index_select along a non-leading dim of a transposed view first copies the
            # whole pool (its cost grew with --max-seqs, not with the positions attended); gathering
            # whole blocks along the pool's leading dim reads only the blocks named, then one more copy
            # of them lays the heads out first (same values, same (B, kvH, L, D) shape)
            paged = pool.index_select(0, blocks.reshape(-1)).view(batch, nb, kv_heads, block_tokens, dim)
            heads_first = paged.transpose(1, 2).reshape(batch, kv_heads, nb * block_tokens, dim)
            return heads_first[:, :, :length]
        heads_first = pool.transpose(0, 1)  # (kvH, blocks, bt, D) view
        paged = heads_first.index_select(1, blocks.reshape(-1))  # (kvH, B*nb, bt, D)
        return paged.view(kv_heads, batch, nb * block_tokens, dim).transpose(0, 1)[:, :, :length]

    @property
    def nbytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()  # key + value

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every row's keys and values read through the table: ``(rows, kvH, blocks_per_row · bt, D)``."""
        everything = slice(0, self.table.rows)
        length = self.table.blocks_per_row * self.table.block_tokens
        key, value = self.view(everything, length)
        return {"key": key, "value": value}
