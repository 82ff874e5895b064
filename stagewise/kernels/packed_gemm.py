"""Packed matmul of 17-127 rows in one Triton launch (batched decode; prefill takes dequantized tiles), every packed type.

:func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` with a single "expert": each program reads
its tile's GGUF blocks once, dequantizes them in registers
(:func:`~stagewise.kernels.packed_blocks_triton.block_values`) and feeds ``tl.dot`` in the activation
dtype with float32 accumulation — no dense copy of the weight, not even a tile in memory. The rows'
alignment to the one expert is the identity (cached per ``(rows, block_m, device)``).
"""

from __future__ import annotations

import dataclasses

import torch

from stagewise.kernels.expert_stacks import PackedStack, PackedTensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.moe_grouped_triton import GemmTiles, grouped_gemm, packed_tiles

# (block_m, tiles) by rows, the fastest of `bench/packed_matmul.py --sweep-fused` on an H200 at Llama-3.1-8B's
# Q4_K shapes (bench/results/packed_h200_r2/packed_gemm_tiles_h200.json): 16-32 rows, gate/up 0.28 / 0.46 ms
# against 0.69 with (64, n64 w8); 33-127 rows, down 0.39 against 0.58 (gate/up within 3 %)
FEW_ROWS_MAX = 32
FEW_ROWS = (16, GemmTiles(block_n=128, block_k=256, num_warps=4, num_stages=2))
MANY_ROWS = (64, GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=2))


def packed_gemm(x: torch.Tensor, weight: PackedStack) -> torch.Tensor:
    """``x (..., in) @ W.T`` -> ``(..., out)`` in ``x``'s dtype for a 2-D packed weight (its planes
    ``(out, plane bytes)``)."""
    out_features, in_features = weight.qs.shape[0], weight.in_features
    a = x.reshape(-1, in_features)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    stack = PackedTensors(weight.qs[None], weight.qh[None], weight.meta[None], weight.ggml_type, in_features)  # views
    tiles = packed_tiles(a.device, stack, in_features)  # block_k for this K
    if a.device.type != "cuda":
        block_m = 16
    else:
        block_m, shape = (FEW_ROWS if rows <= FEW_ROWS_MAX else MANY_ROWS) if rows < 1024 else (128, tiles)
        tiles = dataclasses.replace(shape, block_k=tiles.block_k)
    y = grouped_gemm(a, stack, identity_alignment(rows, block_m, a.device), 1, tiles, gather_rows=False)
    return y.reshape(*x.shape[:-1], out_features)
