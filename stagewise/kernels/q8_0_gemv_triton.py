"""Triton GEMV for Q8_0 weights: few tokens (decode), int8 values and f16 scales read directly.

``y[m] = W[e_m] @ x[m]`` where ``W`` is ``(N, K)`` (one matrix for every row) or a stack
``(E, N, K)`` gathered by ``expert_index[m]`` — the MoE decode path reads only the routed experts.
Each program owns ``BLOCK_N`` output rows of one token and walks K in ``BLOCK_K`` steps; the 32
values of a Q8_0 block are summed before their scale is applied. Accumulation is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.gemv_triton import gemv_grid, gemv_tile
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import dependent_launch, int32_index, launch_device, next_power_of_2

QBLOCK = 32


@triton.jit
def _q8_0_tile(q_rows, s_rows, k0, offs_k, offs_b, K, n_mask, BLOCK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """The int8 values ``(BN, BK)`` and f16 scales ``(BN, BK/32)`` of one K step."""
    k = k0 + offs_k
    q = tl.load(q_rows + k[None, :], mask=n_mask[:, None] & (k[None, :] < K), other=0)
    kb = k0 // 32 + offs_b
    s = tl.load(s_rows + kb[None, :], mask=n_mask[:, None] & (kb[None, :] < K // 32), other=0.0)
    return q, s


@triton.jit
def _q8_0_dot(q, s, x_row, k, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step's partial dot products ``(BN,)``: each 32-value block summed, then scaled."""
    x = tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)  # (BK,)
    blocks = tl.sum(tl.reshape(q.to(tl.float32) * x[None, :], (BLOCK_N, BLOCK_K // 32, 32)), axis=2)
    return tl.sum(blocks * s.to(tl.float32), axis=1)


@triton.jit
def _q8_0_gemv_kernel(
    x_ptr, q_ptr, s_ptr, y_ptr, e_ptr,
    N, K,
    stride_xm, stride_qe, stride_qn, stride_se, stride_sn, stride_ym,
    x_repeat,
    GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_b = tl.arange(0, BLOCK_K // 32)
    q_rows = q_ptr + e * stride_qe + offs_n[:, None].to(tl.int64) * stride_qn
    s_rows = s_ptr + e * stride_se + offs_n[:, None].to(tl.int64) * stride_sn
    x_row = x_ptr + xm * stride_xm
    # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
    q_first, s_first = _q8_0_tile(q_rows, s_rows, 0, offs_k, offs_b, K, n_mask, BLOCK_K)
    if not GATHER:
        wait_for_predecessor(GDC)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc += _q8_0_dot(q_first, s_first, x_row, offs_k, K, BLOCK_N, BLOCK_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        q, s = _q8_0_tile(q_rows, s_rows, k0, offs_k, offs_b, K, n_mask, BLOCK_K)
        acc += _q8_0_dot(q, s, x_row, k0 + offs_k, K, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + m * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages), measured inside CUDA graphs on an H200
# (bench/gemv_graph.py -> bench/results/gemv_graph_h200.json)
GATHER_CONFIG = (4, 512, 4, 3)  # routed experts, K >= 1024 (gate_up): 13 % faster than (8, 512, 4, 4)
GATHER_SHORT_CONFIG = (4, 256, 2, 4)  # routed experts, short K (down, K = 512-768): 5-15 % faster
HEAD_CONFIG = (4, 256, 2, 4)  # LM heads: 3.4-3.5 TB/s
TALL_CONFIG = (2, 1024, 4, 4)  # N > K (fused input projections): 6-10 % faster than ROW_CONFIG
ROW_CONFIG = (1, 2048, 4, 3)  # the rest (N <= K: output projections)


def config_for(n: int, k: int) -> tuple[int, int, int, int]:
    """The tile config of a 2-D ``(n, k)`` Q8_0 weight: a pure function of the shape, so every stage
    reduces in the same order."""
    if n * k >= 200_000_000:
        return HEAD_CONFIG
    return TALL_CONFIG if n > k else ROW_CONFIG


def gathered_config_for(k: int) -> tuple[int, int, int, int]:
    """The tile config of a gathered ``(E, N, k)`` expert stack."""
    return GATHER_CONFIG if k >= 1024 else GATHER_SHORT_CONFIG


def q8_0_gemv(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor, expert_index: torch.Tensor | None = None,
              config: tuple[int, int, int, int] | None = None, x_repeat: int = 1) -> torch.Tensor:
    """``x (M / x_repeat, K)`` -> ``(M, N)``; ``qs`` ``(N, K)`` or ``(E, N, K)`` int8 with ``scales`` ``(…, K/32)`` f16.

    With a 3-D stack, ``expert_index`` ``(M,)`` names each output row's matrix; output row ``m`` reads
    input row ``m // x_repeat`` (a token's K routed experts share its row). K must be a multiple of 32.
    """
    block_n, block_k, warps, stages = config or (gathered_config_for(qs.shape[-1]) if qs.dim() == 3 else config_for(qs.shape[-2], qs.shape[-1]))
    n, k = qs.shape[-2], qs.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0] * x_repeat
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    gather = qs.dim() == 3
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D Q8_0 stack needs one expert index per row")
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D
    qe = qs.stride(0) if gather else 0
    se = scales.stride(0) if gather else 0
    grid = gemv_grid(n, block_n, m)
    with launch_device(x):
        _q8_0_gemv_kernel[grid](
            x2, qs, scales, y, e, n, k,
            x2.stride(0), qe, qs.stride(-2), se, scales.stride(-2), y.stride(0), x_repeat,
            GATHER=gather, BLOCK_N=block_n, BLOCK_K=min(block_k, next_power_of_2(k)),
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y
