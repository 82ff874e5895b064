"""Triton GEMV for Q8_0 weights: few tokens (decode), int8 values and f16 scales read directly.

``y[m] = W[e_m] @ x[m]`` where ``W`` is ``(N, K)`` (one matrix for every row) or a stack
``(E, N, K)`` gathered by ``expert_index[m]`` — the MoE decode path reads only the routed experts.
Each program owns ``BLOCK_N`` output rows of one token and walks K in ``BLOCK_K`` steps; the 32
values of a Q8_0 block are summed before their scale is applied. Accumulation is float32. Values and
scales are addressed through the weight's :class:`~stagewise.weights.quant.q8_0_layout.Q8_0Layout`
(row-major or panels: the same sums in the same order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from stagewise.kernels.gemv_triton import gemv_tile
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.q8_0_address import column_offsets, row_offsets
from stagewise.kernels.triton_launch import dependent_launch, int32_index, launch_device

if TYPE_CHECKING:
    from stagewise.kernels.moe_grouped_triton import Q8_0Stack

QBLOCK = 32


@triton.jit
def _q8_0_tile(q_rows, s_rows, k0, offs_k, offs_b, K, n_mask, s_block, q_block, q_element,
               BLOCK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """The int8 values ``(BN, BK)`` and f16 scales ``(BN, BK/32)`` of one K step."""
    k = k0 + offs_k
    q = tl.load(q_rows + column_offsets(k, q_block, q_element)[None, :], mask=n_mask[:, None] & (k[None, :] < K),
                other=0)
    kb = k0 // 32 + offs_b
    s = tl.load(s_rows + kb[None, :] * s_block, mask=n_mask[:, None] & (kb[None, :] < K // 32), other=0.0)
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
    stride_xm, q_expert, q_row_tile, q_row, q_block, q_element, s_expert, s_row_tile, s_row, s_block, stride_ym,
    x_repeat,
    GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_b = tl.arange(0, BLOCK_K // 32)
    q_rows = q_ptr + e * q_expert + row_offsets(offs_n, q_row_tile, q_row)[:, None]
    s_rows = s_ptr + e * s_expert + row_offsets(offs_n, s_row_tile, s_row)[:, None]
    x_row = x_ptr + xm * stride_xm
    # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
    q_first, s_first = _q8_0_tile(q_rows, s_rows, 0, offs_k, offs_b, K, n_mask, s_block, q_block, q_element,
                                  BLOCK_K)
    if not GATHER:
        wait_for_predecessor(GDC)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc += _q8_0_dot(q_first, s_first, x_row, offs_k, K, BLOCK_N, BLOCK_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        q, s = _q8_0_tile(q_rows, s_rows, k0, offs_k, offs_b, K, n_mask, s_block, q_block, q_element, BLOCK_K)
        acc += _q8_0_dot(q, s, x_row, k0 + offs_k, K, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + m * stride_ym + offs_n, acc.to(y_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages), measured inside CUDA graphs on an H200
# (bench/gemv_graph.py -> bench/results/gemv_graph_h200.json)
GATHER_CONFIG = (4, 512, 4, 3)  # routed experts, K >= 1024 (gate_up): 13 % faster than (8, 512, 4, 4)
GATHER_SHORT_CONFIG = (4, 256, 2, 4)  # routed experts, short K (down, K = 512-768): 5-15 % faster
PANEL_GATHER_CONFIG = (16, 512, 4, 3)  # the panel layout (weights/quant/q8_0_layout): provisional, to be measured
PANEL_GATHER_SHORT_CONFIG = (16, 256, 4, 3)
HEAD_CONFIG = (4, 256, 2, 4)  # LM heads: 3.4-3.5 TB/s
TALL_CONFIG = (2, 1024, 4, 4)  # N > K (fused input projections): 6-10 % faster than ROW_CONFIG
ROW_CONFIG = (1, 2048, 4, 3)  # the rest (N <= K: output projections)


def config_for(n: int, k: int) -> tuple[int, int, int, int]:
    """The tile config of a 2-D ``(n, k)`` Q8_0 weight: a pure function of the shape, so every stage
    reduces in the same order."""
    if n * k >= 200_000_000:
        return HEAD_CONFIG
    return TALL_CONFIG if n > k else ROW_CONFIG


def gathered_config_for(k: int, panels: bool = False) -> tuple[int, int, int, int]:
    """The tile config of a gathered ``(E, N, k)`` expert stack, row-major or in ``panels``."""
    if panels:
        return PANEL_GATHER_CONFIG if k >= 1024 else PANEL_GATHER_SHORT_CONFIG
    return GATHER_CONFIG if k >= 1024 else GATHER_SHORT_CONFIG


def q8_0_gemv(x: torch.Tensor, weight: Q8_0Stack, expert_index: torch.Tensor | None = None,
              config: tuple[int, int, int, int] | None = None, x_repeat: int = 1) -> torch.Tensor:
    """``x (M / x_repeat, K)`` -> ``(M, N)`` for a Q8_0 ``weight`` of shape ``(N, K)`` or ``(E, N, K)`` (any layout).

    With a 3-D stack, ``expert_index`` ``(M,)`` names each output row's matrix; output row ``m`` reads
    input row ``m // x_repeat`` (a token's K routed experts share its row). K must be a multiple of 32.
    """
    shape = weight.shape
    gather = len(shape) == 3
    n, k = shape[-2], shape[-1]
    layout = weight.layout
    block_n, block_k, warps, stages = config or (gathered_config_for(k, layout.panels) if gather else config_for(n, k))
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0] * x_repeat
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D Q8_0 stack needs one expert index per row")
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D
    grid = (triton.cdiv(n, block_n), m)
    with launch_device(x):
        _q8_0_gemv_kernel[grid](
            x2, weight.qs, weight.scales, y, e, n, k,
            x2.stride(0), *layout.value_strides, *layout.scale_strides, y.stride(0), x_repeat,
            GATHER=gather, BLOCK_N=block_n, BLOCK_K=min(block_k, triton.next_power_of_2(k)),
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y
