"""KVCache: one attention block's keys and values, paged through the stage's :class:`BlockTable`.

Writes are provisional by position: positions past a sequence's accepted length are ignored by the
causal mask until the pipeline accepts them, so publish and rollback need no copy.

Keys and values are kept in the activation dtype, or (``storage`` float8 e4m3) as float8 with one
float32 scale per position and KV head: ``scale = max|x| / 448`` over the head's values, stored
``x / scale`` rounded to e4m3 (:func:`fp8_quantize`), read back ``value * scale`` (:func:`fp8_dequantize`).
The Triton kernels store and read the same values (``kernels/rope_store_triton``, the attention kernels).
"""

from __future__ import annotations

import torch

from stagewise.models.block_table import BlockTable

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value
FP8_MIN_SCALE = 2.0**-24  # an all-zero head keeps a positive scale (its values stay 0)


def fp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``(..., D)`` as float8 e4m3 values ``(..., D)`` and float32 scales ``(...)``: each row of D
    scaled by its absolute maximum over 448, rounded to nearest."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / FP8_MAX).clamp_min(FP8_MIN_SCALE)  # (...)
    return (xf / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_dequantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8 ``values`` ``(..., D)`` times their float32 ``scale`` ``(...)``, in ``dtype``."""
    return (values.float() * scale[..., None]).to(dtype)


class KVCache:
    """Keys and values of one attention block, paged: ``(pool_blocks, kv_heads, block_tokens, head_dim)``
    each, addressed through the stage's shared :class:`BlockTable` (position ``p`` of row ``r`` in block
    ``table[r, p // block_tokens]``, offset ``p % block_tokens``)."""

    def __init__(self, table: BlockTable, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, storage: torch.dtype | None = None) -> None:
        shape = (table.pool_blocks, kv_heads, table.block_tokens, head_dim)
        self.dtype = dtype  # what attention computes in (and view returns)
        self.key = torch.zeros(shape, dtype=storage or dtype, device=device)
        self.value = torch.zeros(shape, dtype=storage or dtype, device=device)
        self.key_scale: torch.Tensor | None = None  # fp8: (pool_blocks, kv_heads, block_tokens) float32
        self.value_scale: torch.Tensor | None = None
        if storage == FP8:
            self.key_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)
            self.value_scale = torch.ones(shape[:3], dtype=torch.float32, device=device)
        elif storage not in (None, dtype):
            raise ValueError(f"a KV cache stores {dtype} or float8 e4m3, not {storage}")
        self.table = table

    @property
    def quantized(self) -> bool:
        """Whether keys and values are kept as float8 with per-position, per-head scales."""
        return self.key_scale is not None

    def write(self, positions: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int | None,
              rows: slice | torch.Tensor) -> None:
        """Store ``key``/``value`` ``(B, kvH, T, D)`` of ``rows`` (a span, or each batch row's state row
        ``(B,)``) at ``positions`` ``(B, T)``, through the table
        (``start``, the common first position when there is one, is not needed: every write scatters)."""
        blocks, offsets = self.table.slots(positions, rows)  # (B, T) each
        if self.key_scale is None or self.value_scale is None:
            self.key[blocks, :, offsets] = key.transpose(1, 2)  # (B, T, kvH, D)
            self.value[blocks, :, offsets] = value.transpose(1, 2)
            return
        for pool, scales, x in ((self.key, self.key_scale, key), (self.value, self.value_scale, value)):
            q, scale = fp8_quantize(x.transpose(1, 2))  # (B, T, kvH, D), (B, T, kvH)
            pool[blocks, :, offsets] = q
            scales[blocks, :, offsets] = scale

    def view(self, rows: slice | torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``rows``' (a span, or state rows ``(B,)``) first ``length`` positions, gathered from their blocks:
        ``(B, kvH, length, D)`` (a copy, laid out as a dense per-row cache would be)."""
        blocks = self.table.row_blocks(rows, length)  # (B, nb)
        if self.key_scale is None or self.value_scale is None:
            return self._gather(self.key, blocks, length), self._gather(self.value, blocks, length)
        return (fp8_dequantize(self._gather(self.key, blocks, length),
                               self._gather(self.key_scale[..., None], blocks, length)[..., 0], self.dtype),
                fp8_dequantize(self._gather(self.value, blocks, length),
                               self._gather(self.value_scale[..., None], blocks, length)[..., 0], self.dtype))

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
        scales = 2 * self.key_scale.numel() * self.key_scale.element_size() if self.key_scale is not None else 0
        return 2 * self.key.numel() * self.key.element_size() + scales  # key + value (+ their scales)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every row's keys and values read through the table: ``(rows, kvH, blocks_per_row · bt, D)``."""
        everything = slice(0, self.table.rows)
        length = self.table.blocks_per_row * self.table.block_tokens
        key, value = self.view(everything, length)
        return {"key": key, "value": value}
