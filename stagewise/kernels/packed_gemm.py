"""Packed matmul for many rows in one Triton launch (prefill, batched decode), for every packed type.

:func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` with a single "expert": each program reads
its tile's GGUF blocks once, dequantizes them in registers
(:func:`~stagewise.kernels.packed_blocks_triton.block_values`) and feeds ``tl.dot`` in the activation
dtype with float32 accumulation — no dense copy of the weight, not even a tile in memory. The rows'
alignment to the one expert is the identity (cached per ``(rows, block_m, device)``).
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.moe_grouped_triton import PackedTensors, grouped_gemm, packed_tiles
from stagewise.kernels.q8_0_gemm import _identity_alignment


def packed_gemm(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int) -> torch.Tensor:
    """``x (..., in) @ W.T`` -> ``(..., out)`` in ``x``'s dtype for a 2-D packed weight ``raw``
    uint8 ``(out, row_bytes)`` of ``in_features`` values of ``ggml_type`` a row."""
    out_features = raw.shape[0]
    a = x.reshape(-1, in_features)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    stack = PackedTensors(raw[None], ggml_type, in_features)  # (1, out, row_bytes): a view
    block_m = 16 if a.device.type != "cuda" else (128 if rows >= 1024 else 64)
    tiles = packed_tiles(a.device, stack, in_features)
    y = grouped_gemm(a, stack, _identity_alignment(rows, block_m, a.device), 1, tiles, gather_rows=False)
    return y.reshape(*x.shape[:-1], out_features)
