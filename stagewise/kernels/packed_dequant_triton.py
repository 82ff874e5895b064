"""Triton dequantization of a bounded slab of packed rows: prefill tiles and embedding gathers.

``dequantize_rows(planes (R, plane bytes) each, type, k, dtype) -> (R, k)``: each program expands a
``(BLOCK_R, BLOCK_K)`` tile of the rows' planes (:class:`~stagewise.spec.packed_types.PlaneLayout`)
with :func:`~stagewise.kernels.packed_blocks_triton.block_values`. FMA
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

from stagewise.kernels.expert_stacks import check_planes
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import block_values
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2
from stagewise.spec.packed_types import block_elements

BLOCK_R = 16  # rows a program
BLOCK_K = 256  # values a program's row (one super-block; eight 32-value blocks)
NUM_WARPS = 4


@triton.jit
def _dequant_kernel(
    qs_ptr, qh_ptr, meta_ptr, out_ptr, R, K, stride_qs, stride_qh, stride_meta, stride_out,
    TYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    k0 = tl.program_id(1) * BLOCK_K
    r_mask = offs_r < R
    r64 = offs_r.to(tl.int64)
    v = block_values(qs_ptr + r64 * stride_qs, qh_ptr + r64 * stride_qh, meta_ptr + r64 * stride_meta, k0, K, r_mask,
                     TYPE, BLOCK_R, BLOCK_K)  # (BLOCK_R, BLOCK_K) float32
    k = k0 + tl.arange(0, BLOCK_K)
    out = out_ptr + offs_r[:, None].to(tl.int64) * stride_out + k[None, :]
    tl.store(out, v.to(out_ptr.dtype.element_ty), mask=r_mask[:, None] & (k[None, :] < K))


def dequantize_rows(qs: torch.Tensor, qh: torch.Tensor, meta: torch.Tensor, ggml_type: GGMLQuantizationType, k: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Planes ``qs``, ``qh``, ``meta`` uint8 ``(R, plane bytes)`` of rows of ``k`` values of ``ggml_type``
    (each plane's bytes contiguous) -> ``(R, k)`` in ``dtype``: exactly ``gguf.quants.dequantize`` in
    float32, rounded once otherwise."""
    check_planes(qs, qh, meta, ggml_type, k, dims=(2,))
    out = torch.empty((qs.shape[0], k), dtype=dtype, device=qs.device)
    if qs.shape[0] == 0:
        return out
    qh_arg = qh if qh.shape[-1] else qs  # no high plane: any pointer (never read)
    block_k = max(block_elements(ggml_type), min(BLOCK_K, next_power_of_2(k)))
    grid = (cdiv(qs.shape[0], BLOCK_R), cdiv(k, block_k))
    with launch_device(qs):
        _dequant_kernel[grid](
            qs, qh_arg, meta, out, qs.shape[0], k, qs.stride(0), qh_arg.stride(0), meta.stride(0), out.stride(0),
            TYPE=int(ggml_type), BLOCK_R=BLOCK_R, BLOCK_K=block_k, num_warps=NUM_WARPS,
            enable_fp_fusion=False,  # NOTE: d * q + m must round twice, as gguf.quants does
            **dependent_launch(qs),
        )
    return out
