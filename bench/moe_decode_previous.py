"""The batched-decode expert GEMM as of commit 6f85180 (the A/B baseline of bench/q8_0_decode_sweep.py).

Grouped Q8_0 expert GEMM for batched decode: a few routed tokens per expert, weights read once.

Contract as :func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` (``out[s] = A[row(s)] @
W[expert(s)].T`` over the alignment's blocks, optionally times the slot's routing weight), for a
Q8_0 stack only. What differs is where the scale is applied: each 32-value Q8_0 block's int8 values
enter ``tl.dot`` as they are (exact in bf16/f16: ``|q| <= 128``), and the block's f16 scale
multiplies that partial dot in float32 — the Q8_0 GEMV's order (sum the block, then scale), not the
prefill GEMM's (dequantize each value, round it to the activation dtype, then dot).

Why: with ``BLOCK_M = 16`` rows and ~2 tokens per expert the prefill kernel spends per weight value
an int8 -> float32 conversion, a multiply and a float32 -> bf16 conversion (in its SASS: I2F, FMUL,
F2FP), and loads its ``(BK, BN)`` tiles one byte at a time (K is the stored inner dimension). Here the
weights are loaded as ``(BN, 32)`` tiles along K (vector loads), an int8 becomes a bf16 by byte
permutes, and the scale costs one multiply per output per block instead of per weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.moe_grouped_triton import GemmTiles, Q8_0Stack
from stagewise.kernels.triton_launch import launch_device


@triton.jit
def _decode_gemm_kernel(
    a_ptr, q_ptr, s_ptr, out_ptr, route_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, K, num_slots, top_k,
    stride_am, stride_ak, stride_qe, stride_qn, stride_qk,
    stride_se, stride_sn, stride_sk, stride_om, stride_on,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
):
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_N)
    if pid_m >= tl.load(valid_ptr):
        return  # a padding block past every expert's run
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    slots = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # (BM,)
    row_ok = slots < num_slots
    rows = slots // top_k if GATHER_ROWS else slots
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, 32)  # one Q8_0 block
    groups = tl.arange(0, GROUPS)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BM, 32)
    # NOTE: (BN, 32) tiles, K innermost as stored: the loads are vectors, not single bytes
    q_ptrs = q_ptr + expert * stride_qe + offs_n[:, None].to(tl.int64) * stride_qn + offs_k[None, :] * stride_qk
    s_ptrs = s_ptr + expert * stride_se + offs_n[:, None].to(tl.int64) * stride_sn + groups[None, :] * stride_sk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K // (32 * GROUPS)):  # K is a whole number of K steps (checked by the caller)
        scales = tl.load(s_ptrs, mask=n_ok[:, None], other=0.0).to(tl.float32)  # (BN, G) this step's scales
        for g in tl.static_range(GROUPS):
            a = tl.load(a_ptrs + g * 32 * stride_ak, mask=row_ok[:, None], other=0.0)  # (BM, 32)
            q = tl.load(q_ptrs + g * 32 * stride_qk, mask=n_ok[:, None], other=0)  # (BN, 32) int8
            s = tl.sum(tl.where(groups[None, :] == g, scales, 0.0), axis=1)  # (BN,) block g's scales
            if BF16:
                part = tl.dot(a, tl.trans(q.to(tl.bfloat16)))  # (BM, BN) float32; int8 is exact in bf16
            else:  # NOTE: the interpreter holds bf16 as raw uint16: float32 there
                part = tl.dot(a.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")
            acc += part * s[None, :]
        a_ptrs += 32 * GROUPS * stride_ak
        q_ptrs += 32 * GROUPS * stride_qk
        s_ptrs += GROUPS * stride_sk
    if ROUTE_WEIGHT:
        route = tl.load(route_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)  # (BM,)
        acc = acc * route[:, None]
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def decode_gemm(a: torch.Tensor, weight: Q8_0Stack, align: MoeAlignment, top_k: int, tiles: GemmTiles, *,
                gather_rows: bool, top_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-slot ``(S, out)`` rows of ``A[row(s)] @ W[expert(s)].T`` for a Q8_0 stack (module doc);
    ``tiles.block_k`` is the K step (a multiple of 32 dividing ``in``)."""
    qs, scales = weight.qs, weight.scales
    _, n_out, k_in = qs.shape
    if a.shape[-1] != k_in:
        raise ValueError(f"activations have {a.shape[-1]} features, the experts take {k_in}")
    if tiles.block_k % 32 or k_in % tiles.block_k:
        raise ValueError(f"the K step {tiles.block_k} must be a multiple of 32 dividing {k_in}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out
    grid = (num_blocks * triton.cdiv(n_out, tiles.block_n),)
    with launch_device(a):
        _decode_gemm_kernel[grid](
            a, qs, scales, out, route,
            align.sorted_slots, align.block_expert, align.num_valid_blocks,
            n_out, k_in, num_slots, top_k,
            a.stride(0), a.stride(1), qs.stride(0), qs.stride(1), qs.stride(2),
            scales.stride(0), scales.stride(1), scales.stride(2), out.stride(0), out.stride(1),
            GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None,
            BF16=a.device.type == "cuda" and a.dtype == torch.bfloat16,
            BLOCK_M=align.block_m, BLOCK_N=tiles.block_n, GROUPS=tiles.block_k // 32,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return out
