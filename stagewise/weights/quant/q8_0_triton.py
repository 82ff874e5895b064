"""Triton kernel: ``y = x @ dequant(W).T`` reading Q8_0 int8 values and f16 scales directly.

Not on the serving path: the GEMV kernel (:mod:`stagewise.weights.quant.q8_0_gemv_triton`) measured
4-10x faster for decode, so this tiled ``tl.dot`` kernel stays only as the reference that
``bench/q8_0_kernels.py`` compares against. Tiles: BLOCK_M tokens x BLOCK_N output rows, stepping BLOCK_K
(a multiple of 32) along the input; each int8 tile is scaled per 32-element block in float32
and fed to ``tl.dot`` in the activation dtype; accumulation is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.triton_launch import launch_device


@triton.jit
def _q8_0_matmul_kernel(
    x_ptr, q_ptr, s_ptr, y_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_qn, stride_qk, stride_sn, stride_sk, stride_ym, stride_yn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)  # (BM, BK)
        wmask = (offs_n[:, None] < N) & (k[None, :] < K)
        q = tl.load(q_ptr + offs_n[:, None] * stride_qn + k[None, :] * stride_qk, mask=wmask, other=0)  # (BN, BK)
        s = tl.load(s_ptr + offs_n[:, None] * stride_sn + (k[None, :] // 32) * stride_sk, mask=wmask, other=0.0)
        w = (q.to(tl.float32) * s.to(tl.float32)).to(x.dtype)  # (BN, BK)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    y = acc.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, y,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), from a sweep on an H200 (4096 x 4096, bf16):
# decode (<= 16 tokens) wants many narrow programs over N. Measured there: 66 us for 1 token vs 27 us
# for the dense bf16 matmul; prefill is left to the tiled dequantize + cuBLAS path (Q8_0Weight.matmul).
TILES = {"decode": (16, 16, 256, 4, 3), "prefill": (128, 16, 64, 4, 3)}


def q8_0_matmul(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor,
                tiles: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``x (..., K) @ W.T -> (..., N)`` with ``W`` given as ``qs (N, K)`` int8 + ``scales (N, K/32)`` f16."""
    n, k = qs.shape
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], n)
    block_m, block_n, block_k, warps, stages = tiles or TILES["decode" if m <= 16 else "prefill"]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    with launch_device(x):
        _q8_0_matmul_kernel[grid](
            x2, qs, scales, y, m, n, k,
            x2.stride(0), x2.stride(1), qs.stride(0), qs.stride(1), scales.stride(0), scales.stride(1),
            y.stride(0), y.stride(1),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
        )
    return y.reshape(*x.shape[:-1], n)
