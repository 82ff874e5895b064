"""Triton GEMV for dense half-precision weights: decode's matmuls (a few tokens) at memory speed.

``y[m] = W[e_m] @ x[m]`` with ``W`` ``(N, K)`` (one matrix for every row) or a stack ``(E, N, K)``
gathered by ``expert_index[m]`` (MoE decode reads only the routed experts). Each program owns
``BLOCK_N`` output rows of one token and streams ``K`` in ``BLOCK_K`` steps, accumulating in float32.

The tile config is a fixed function of the weight's shape and of whether kernels overlap by
dependent launch (:func:`config_for`), never autotuned at run time: the reduction order follows the
config, and a staged run must reduce exactly like a single-device run. ``bench/gemv_graph.py``
measures ours against cuBLAS inside CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, int32_index, launch_device, next_power_of_2

GEMV_MAX_TOKENS = 4  # more tokens: cuBLAS's GEMM re-reads nothing and wins


@triton.jit
def gemv_tile(e_ptr, N, x_repeat, GATHER: tl.constexpr, BLOCK_N: tl.constexpr):  # type: ignore[no-untyped-def]
    """This program's share of a GEMV (the dense, Q8_0 and packed kernels'): output row ``m``, its input row,
    its expert (0 without a stack), its ``BLOCK_N`` output columns and their mask.

    The grid is one-dimensional, :func:`gemv_grid` programs, output rows fastest: the programs that run
    together read the same weight tile, so a step of several rows reads each weight from memory once (the
    others hit L2). Columns fastest, each row swept the whole matrix before the next began, and a matrix
    larger than L2 (an output head, a fused projection) was read from memory once per row."""
    rows = tl.num_programs(0) // tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    m = pid % rows
    pid_n = pid // rows
    xm = m // x_repeat  # the input row of output row m
    if GATHER:
        e = tl.load(e_ptr + m).to(tl.int64)
    else:
        e = 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return m, xm, e, offs_n, offs_n < N


def gemv_grid(n: int, block_n: int, rows: int) -> tuple[int]:
    """The launch grid :func:`gemv_tile` decodes: ``rows`` output rows times ``n / block_n`` column tiles."""
    return (cdiv(n, block_n) * rows,)


@triton.jit
def _weight_tile(rows, k, K, n_mask, EVEN_K: tl.constexpr):  # type: ignore[no-untyped-def]
    if EVEN_K:
        w = tl.load(rows + k[None, :], mask=n_mask[:, None], other=0.0)
    else:
        w = tl.load(rows + k[None, :], mask=n_mask[:, None] & (k[None, :] < K), other=0.0)
    return w.to(tl.float32)


@triton.jit
def _input_tile(x_row, k, K, EVEN_K: tl.constexpr):  # type: ignore[no-untyped-def]
    if EVEN_K:
        x = tl.load(x_row + k)
    else:
        x = tl.load(x_row + k, mask=k < K, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, e_ptr, r_ptr,
    N, K,
    stride_xm, stride_we, stride_wn, stride_ym, stride_rm,
    x_repeat,
    GATHER: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    x_row = x_ptr + xm * stride_xm
    # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
    w_first = _weight_tile(rows, offs_k, K, n_mask, EVEN_K)
    if not GATHER:
        wait_for_predecessor(GDC)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc += w_first * _input_tile(x_row, offs_k, K, EVEN_K)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        k = k0 + offs_k
        acc += _weight_tile(rows, k, K, n_mask, EVEN_K) * _input_tile(x_row, k, K, EVEN_K)[None, :]
    y = tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty)
    if RESIDUAL:  # rounded, then added in float32 and rounded again: exactly torch's ``y + residual``
        r = tl.load(r_ptr + m * stride_rm + offs_n, mask=n_mask, other=0.0)
        y = (y.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + m * stride_ym + offs_n, y, mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages), measured inside CUDA graphs, back to back over weights
# past the L2, as decode runs them (bench/gemv_graph.py -> bench/results/gemv_graph_h200.json)
DEFAULT_CONFIG = (8, 512, 4, 3)  # gathered expert stacks
ROW_CONFIG = (1, 1024, 4, 3)  # within 2 % of the best candidate on Llama-8B's o and down, 2-3x cuBLAS on routers
HEAD_CONFIG = (4, 256, 2, 4)  # LM heads: 4.35 TB/s, 12 % faster than cuBLAS
HEAD_MIN_ELEMENTS = 200_000_000
TALL_MIN_ROWS = 6144  # q/k/v and gate_up (N > K): cuBLAS leads by 1-6 % when launches do not overlap
# ... and ours with dependent launch (its first weight tile read while the previous kernel ends,
# which cuBLAS's launch cannot do): Llama-3.1-8B decode 240 tok/s against 230 with cuBLAS there
TALL_OVERLAPPED_CONFIG = (2, 1024, 4, 4)


def config_for(n: int, k: int, overlapped: bool = False) -> tuple[int, int, int, int] | None:
    """The tile config for a 2-D ``(n, k)`` weight, or None where cuBLAS is faster; ``overlapped``:
    our kernels launch dependently (``triton_launch.dependent_launch``). A pure function of its
    arguments (see the module note)."""
    if n * k >= HEAD_MIN_ELEMENTS:
        return HEAD_CONFIG
    if n >= TALL_MIN_ROWS and n > k:
        return TALL_OVERLAPPED_CONFIG if overlapped else None
    return ROW_CONFIG


def gemv(x: torch.Tensor, weight: torch.Tensor, expert_index: torch.Tensor | None = None,
         config: tuple[int, int, int, int] | None = None, x_repeat: int = 1,
         residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K)`` -> ``(..., N)`` for ``weight`` ``(N, K)``; or, for a stack ``(E, N, K)``, ``(M, N)`` with
    output row ``m`` = ``weight[expert_index[m]] @ x[m // x_repeat]`` (a token's K routed experts share
    its row). ``weight``'s last dim must be contiguous. ``residual`` (the output's shape, 2-D weights
    only) is added to the rounded product in the same launch, as ``gemv(x, weight) + residual`` would."""
    n, k = weight.shape[-2], weight.shape[-1]
    if weight.stride(-1) != 1:
        raise ValueError("gemv needs the weight's input dim contiguous")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0] * x_repeat
    gather = weight.dim() == 3
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D weight stack needs one expert index per row")
    block_n, block_k, warps, stages = config or (DEFAULT_CONFIG if weight.dim() == 3 else config_for(n, k)
                                                 or DEFAULT_CONFIG)
    block_k = min(block_k, next_power_of_2(k))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D
    r = y  # unused without a residual
    if residual is not None:
        if gather or residual.shape != (*x.shape[:-1], n):
            raise ValueError(f"residual {tuple(residual.shape)} != the output's {(*x.shape[:-1], n)} (2-D weights only)")
        r = residual.reshape(-1, n)
        if r.stride(-1) != 1:
            r = r.contiguous()
    with launch_device(x):
        _gemv_kernel[gemv_grid(n, block_n, m)](
            x2, weight, y, e, r, n, k,
            x2.stride(0), weight.stride(0) if gather else 0, weight.stride(-2), y.stride(0), r.stride(0), x_repeat,
            GATHER=gather, RESIDUAL=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y.reshape(*x.shape[:-1], n) if not gather else y
