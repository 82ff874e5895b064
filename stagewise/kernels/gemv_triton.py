"""Triton GEMV for dense half-precision weights: decode's matmuls (a few tokens) at memory speed.

``y[m] = W[e_m] @ x[m]`` with ``W`` ``(N, K)`` (one matrix for every row) or a stack ``(E, N, K)``
gathered by ``expert_index[m]`` (MoE decode reads only the routed experts). Each program owns
``BLOCK_N`` output rows of one token and streams ``K`` in ``BLOCK_K`` steps, accumulating in float32.

The tile config is a fixed function of the weight's shape (:func:`config_for`), never autotuned at
run time: the reduction order follows the config, and a staged run must reduce exactly like a
single-device run. cuBLAS reaches 1.8-2.8 TB/s on these shapes at one token on an H200
(``bench/results/q8_0_kernels_h200.json``, dense column); ``bench/gemv_configs.py`` measures ours.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.triton_launch import int32_index, launch_device

GEMV_MAX_TOKENS = 4  # more tokens: cuBLAS's GEMM re-reads nothing and wins


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, e_ptr,
    N, K,
    stride_xm, stride_we, stride_wn, stride_ym,
    x_repeat, k_per_split, stride_ps,
    GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    split = tl.program_id(2)
    xm = m // x_repeat  # the input row of output row m
    if GATHER:
        e = tl.load(e_ptr + m).to(tl.int64)
    else:
        e = 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    rows = w_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k_lo = split * k_per_split
    for k0 in range(k_lo, tl.minimum(k_lo + k_per_split, K), BLOCK_K):
        k = k0 + offs_k
        if EVEN_K:
            x = tl.load(x_ptr + xm * stride_xm + k).to(tl.float32)
            w = tl.load(rows + k[None, :], mask=n_mask[:, None], other=0.0)
        else:
            x = tl.load(x_ptr + xm * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
            w = tl.load(rows + k[None, :], mask=n_mask[:, None] & (k[None, :] < K), other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    total = tl.sum(acc, axis=1)
    if SPLIT == 1:
        tl.store(y_ptr + m * stride_ym + offs_n, total.to(y_ptr.dtype.element_ty), mask=n_mask)
    else:  # float32 partial of this K slice; splitk_reduce sums the slices in a fixed order
        tl.store(y_ptr + split * stride_ps + m * stride_ym + offs_n, total, mask=n_mask)


@triton.jit
def _splitk_reduce_kernel(p_ptr, y_ptr, total, stride_ps, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + s * stride_ps + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def splitk_partials(m: int, n: int, split: int, device: torch.device) -> torch.Tensor:
    """The float32 ``(split, m, n)`` buffer a split-K GEMV writes its K slices' partial sums into."""
    return torch.empty((split, m, n), dtype=torch.float32, device=device)


def splitk_reduce(partials: torch.Tensor, y: torch.Tensor) -> None:
    """``y (m, n)`` = sum of ``partials (split, m, n)`` over the split dim in index order (deterministic)."""
    total = y.numel()
    block = 1024
    _splitk_reduce_kernel[(triton.cdiv(total, block),)](partials, y, total, partials.stride(0),
                                                        SPLIT=partials.shape[0], BLOCK=block, num_warps=4)


# (BLOCK_N, BLOCK_K, num_warps, num_stages[, split]): split > 1 cuts K into that many slices, one
# program each, whose float32 partials a second launch sums in a fixed order (no atomics)
DEFAULT_CONFIG = (8, 512, 4, 3)  # gathered expert stacks
LARGE_CONFIG = (1, 2048, 4, 3)  # one row per program, long K strides
LARGE_MIN_ELEMENTS = 50_000_000  # measured on the H200 (bench/results/gemv_configs_h200.json): from Llama-8B's
# down (4096 x 14336) up, LARGE_CONFIG beats cuBLAS by 5-10 %; on q/k/v- and o-sized matrices cuBLAS is 1.2-2x faster


Config = tuple[int, ...]


def config_for(n: int, k: int) -> Config | None:
    """The tile config for a 2-D ``(n, k)`` weight, or None where cuBLAS is faster: a pure function of
    the shape (see the module note)."""
    return LARGE_CONFIG if n * k >= LARGE_MIN_ELEMENTS else None


def split_k(k: int, block_k: int, split: int) -> tuple[int, int]:
    """(slices, K per slice) for cutting ``k`` into at most ``split`` slices of whole ``block_k`` steps."""
    steps = triton.cdiv(k, block_k)
    per = triton.cdiv(steps, max(split, 1))
    return triton.cdiv(steps, per), per * block_k


def gemv(x: torch.Tensor, weight: torch.Tensor, expert_index: torch.Tensor | None = None,
         config: Config | None = None, x_repeat: int = 1) -> torch.Tensor:
    """``x (..., K)`` -> ``(..., N)`` for ``weight`` ``(N, K)``; or, for a stack ``(E, N, K)``, ``(M, N)`` with
    output row ``m`` = ``weight[expert_index[m]] @ x[m // x_repeat]`` (a token's K routed experts share
    its row). ``weight``'s last dim must be contiguous."""
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
    cfg = config or (DEFAULT_CONFIG if weight.dim() == 3 else config_for(n, k) or DEFAULT_CONFIG)
    block_n, block_k, warps, stages = cfg[:4]
    block_k = min(block_k, triton.next_power_of_2(k))
    split, k_per_split = split_k(k, block_k, cfg[4] if len(cfg) > 4 else 1)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    out = splitk_partials(m, n, split, x.device) if split > 1 else y
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D
    with launch_device(x):
        _gemv_kernel[(triton.cdiv(n, block_n), m, split)](
            x2, weight, out, e, n, k,
            x2.stride(0), weight.stride(0) if gather else 0, weight.stride(-2), n if split > 1 else y.stride(0),
            x_repeat, k_per_split, out.stride(0) if split > 1 else 0,
            GATHER=gather, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0 and k_per_split % block_k == 0,
            SPLIT=split, num_warps=warps, num_stages=stages,
        )
        if split > 1:
            splitk_reduce(out, y)
    return y.reshape(*x.shape[:-1], n) if not gather else y
