"""Q8_0 matmul for many tokens (prefill) in one Triton launch: the grouped GEMM with a single "expert".

The reference path (:meth:`Q8_0Weight._tiled_matmul`) dequantizes bounded tiles of the weight to
float32, casts them and calls the device's GEMM: ~6 launches and ~6 bytes of traffic per weight
element. Here :func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` reads the int8 values and
f16 scales once and dequantizes each tile in registers (as ``Q8_0Weight`` does) before ``tl.dot``.
The alignment of ``M`` rows to one expert is the identity, built once per ``(M, block, device)``.
"""

from __future__ import annotations

import functools

import torch

from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.moe_grouped_triton import (
    INTERPRETER,
    TILES_64_Q8_0_GATE_UP,
    TILES_128,
    GemmTiles,
    Q8_0Tensors,
    grouped_gemm,
)

DECODE_ROWS = 64
TILES_DECODE_DENSE = GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=4)


@functools.lru_cache(maxsize=64)
def _identity_alignment(rows: int, block_m: int, device: torch.device) -> MoeAlignment:
    """Rows ``0..rows-1`` in order, all of expert 0, padded to whole ``block_m`` blocks."""
    blocks = -(-rows // block_m)
    slots = torch.arange(blocks * block_m, dtype=torch.int32, device=device)
    slots = torch.where(slots < rows, slots, torch.full_like(slots, rows))  # padding = rows
    block_expert = torch.zeros(blocks, dtype=torch.int32, device=device)
    valid = torch.full((1,), blocks, dtype=torch.int32, device=device)
    return MoeAlignment(slots, block_expert, valid, rows, block_m)


def _tiles(rows: int, device: torch.device) -> tuple[int, GemmTiles]:
    """``(block_m, tiles)``: a function of the row count and device kind only (deterministic)."""
    if device.type != "cuda":
        return INTERPRETER.block_m, INTERPRETER.gate_up
    if rows <= DECODE_ROWS:  # a batched decode step: 16-row blocks, narrow tiles (enough programs to read fast)
        return 16, TILES_DECODE_DENSE
    return (128, TILES_128) if rows >= 1024 else (64, TILES_64_Q8_0_GATE_UP)


def q8_0_gemm(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x (..., in) @ W.T`` -> ``(..., out)`` in ``x``'s dtype for a 2-D Q8_0 weight: int8 ``qs`` ``(out, in)``,
    f16 ``scales`` ``(out, in / 32)``."""
    out_features, in_features = qs.shape
    a = x.reshape(-1, in_features)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    block_m, tiles = _tiles(rows, a.device)
    stack = Q8_0Tensors(qs[None], scales[None])  # (1, out, in): a view
    y = grouped_gemm(a, stack, _identity_alignment(rows, block_m, a.device), 1, tiles, gather_rows=False)
    return y.reshape(*x.shape[:-1], out_features)
