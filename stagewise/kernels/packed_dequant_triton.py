"""Triton dequantization of a bounded slab of GGUF block rows: prefill tiles and embedding gathers.

``dequantize_rows(raw (R, row_bytes), type, k, dtype) -> (R, k)``: each program expands a
``(BLOCK_R, BLOCK_K)`` tile with :func:`~stagewise.kernels.packed_blocks_triton.block_values` (Q4_K and
Q5_K by 8-byte slots, :func:`~stagewise.kernels.packed_blocks_triton.k_slots`, stored as vectors). FMA
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
from stagewise.kernels.packed_blocks_triton import SLOT_TYPES, block_values, k_slots
from stagewise.kernels.triton_launch import dependent_launch, launch_device
from stagewise.weights.quant.packed_types import PACKED, block_elements, row_bytes

BLOCK_R = 16  # rows a program
BLOCK_K = 256  # values a program's row (one super-block; eight 32-value blocks)
NUM_WARPS = 4
SLOT_BLOCK_R, SLOT_BLOCK_K = 4, 1024  # Q4_K / Q5_K by slots: 4 rows x 4 super-blocks (NOTE: unmeasured)


@triton.jit
def _store_slots(out_rows, r_mask, k0, K, values, NB: tl.constexpr, OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]
    """Store a slot tile's values ``(BR, NB, 4, 4, 8)`` at ``64c + 8g + l + OFFSET`` of each super-block
    (the mask constant along ``l``, so the stores are vectors)."""
    b = k0 // 256 + tl.arange(0, NB)[None, :, None, None, None]
    c = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 4)[None, None, None, :, None]
    l8 = tl.arange(0, 8)[None, None, None, None, :]
    at = b * 256 + 64 * c + 8 * g + l8 + OFFSET
    mask = r_mask[:, None, None, None, None] & (b < K // 256)
    tl.store(out_rows[:, None, None, None, None] + at, values.to(out_rows.dtype.element_ty), mask=mask)


@triton.jit
def _dequant_kernel(
    raw_ptr, raw32_ptr, out_ptr, R, K, stride_raw, stride_out,
    TYPE: tl.constexpr, SLOTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k0 = tl.program_id(1) * BLOCK_K
    r_mask = offs_r < R
    rows = raw_ptr + offs_r.to(tl.int64) * stride_raw
    if SLOTS:  # value = (d * scale) * q - (dmin * min), each product rounded: gguf.quants' order
        NB: tl.constexpr = BLOCK_K // 256
        rows32 = raw32_ptr + offs_r.to(tl.int64) * (stride_raw // 4)
        quants, high, s0, s1, m0, m1 = k_slots(rows, rows32, k0, K, r_mask, TYPE, NB)
        c = tl.arange(0, 4)[None, None, :, None, None]
        q0 = quants & 15
        q1 = quants >> 4
        if TYPE == 13:
            q0 = q0 | (((high >> (2 * c)) & 1) << 4)
            q1 = q1 | (((high >> (2 * c + 1)) & 1) << 4)
        out_rows = out_ptr + offs_r.to(tl.int64) * stride_out
        v0 = s0[:, :, :, :, None] * q0.to(tl.float32) - m0[:, :, :, :, None]
        v1 = s1[:, :, :, :, None] * q1.to(tl.float32) - m1[:, :, :, :, None]
        _store_slots(out_rows, r_mask, k0, K, v0, NB, 0)
        _store_slots(out_rows, r_mask, k0, K, v1, NB, 32)
    else:
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
    slots = ggml_type in SLOT_TYPES
    if slots and (raw.stride(0) % 4 or raw.data_ptr() % 16):  # a function of shape only: never switch on an address
        raise ValueError(f"{ggml_type.name} rows must start 16-byte aligned with a row stride a multiple of 4 bytes")
    block_r, block_k = (SLOT_BLOCK_R, SLOT_BLOCK_K) if slots else (BLOCK_R, BLOCK_K)
    block_k = max(block_elements(ggml_type), min(block_k, triton.next_power_of_2(k)))
    grid = (triton.cdiv(raw.shape[0], block_r), triton.cdiv(k, block_k))
    with launch_device(raw):
        _dequant_kernel[grid](
            raw, raw.view(torch.int32) if slots else raw, out, raw.shape[0], k, raw.stride(0), out.stride(0),
            TYPE=int(ggml_type), SLOTS=slots, BLOCK_R=block_r, BLOCK_K=block_k, num_warps=NUM_WARPS,
            enable_fp_fusion=False,  # NOTE: d * q + m must round twice, as gguf.quants does
            **dependent_launch(raw),
        )
    return out
