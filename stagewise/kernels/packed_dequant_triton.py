"""Triton dequantization of a bounded slab of GGUF block rows: prefill tiles and embedding gathers.

``dequantize_rows(raw (R, row_bytes), type, k, dtype) -> (R, k)``: each program expands a
``(BLOCK_R, BLOCK_K)`` tile with :func:`~stagewise.kernels.packed_blocks_triton.block_values`. FMA
contraction is off for this kernel, so the float32 values are bit-identical to ``gguf.quants`` and
to the torch reference (:mod:`stagewise.weights.quant.dequant`); other dtypes are those values
rounded once. The kernel waits for its predecessor before reading ``raw`` (an embedding's rows come
from ``index_select``); output size depends on shapes only (CUDA graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import block_values
from stagewise.kernels.triton_launch import dependent_launch, launch_device
from stagewise.spec.packed_types import PACKED, block_elements, row_bytes

BLOCK_R = 16  # rows a program
BLOCK_K = 256  # values a program's row (one super-block; eight 32-value blocks)
NUM_WARPS = 4


@triton.jit
def _dequant_kernel(
    raw_ptr, out_ptr, R, K, stride_raw, stride_out,
    TYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k0 = tl.program_id(1) * BLOCK_K
    r_mask = offs_r < R
    rows = raw_ptr + offs_r.to(tl.int64) * stride_raw
    v = block_values(rows, k0, K, r_mask, TYPE, BLOCK_R, BLOCK_K)  # (BLOCK_R, BLOCK_K) float32
    k = k0 + tl.arange(0, BLOCK_K)
    out = out_ptr + offs_r[:, None].to(tl.int64) * stride_out + k[None, :]
    tl.store(out, v.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & (k[None, :] < K))


def dequantize_rows(raw: torch.Tensor, ggml_type: GGMLQuantizationType, k: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``raw`` uint8 ``(R, row_bytes)`` (rows of ``k`` values of ``ggml_type``, last dim contiguous) ->
    ``(R, k)`` in ``dtype``: exactly ``gguf.quants.dequantize`` in float32, rounded once otherwise."""
    if ggml_type not in PACKED:
        raise ValueError(f"{ggml_type.name} is not a packed block type")
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.stride(-1) != 1:
        raise ValueError("dequantize_rows needs uint8 rows (R, row_bytes) with contiguous bytes")
    if k % block_elements(ggml_type) or raw.shape[1] != row_bytes(ggml_type, k):
        raise ValueError(f"{ggml_type.name}: {raw.shape[1]} bytes per row do not hold {k} values")
    out = torch.empty((raw.shape[0], k), dtype=dtype, device=raw.device)
    if raw.shape[0] == 0:
        return out
    block_k = max(block_elements(ggml_type), min(BLOCK_K, triton.next_power_of_2(k)))
    grid = (triton.cdiv(raw.shape[0], BLOCK_R), triton.cdiv(k, block_k))
    with launch_device(raw):
        _dequant_kernel[grid](
            raw, out, raw.shape[0], k, raw.stride(0), out.stride(0),
            TYPE=int(ggml_type), BLOCK_R=BLOCK_R, BLOCK_K=block_k, num_warps=NUM_WARPS,
            enable_fp_fusion=False,  # NOTE: d * q + m must round twice, as gguf.quants does
            **dependent_launch(raw),
        )
    return out
