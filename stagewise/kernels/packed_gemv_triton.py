"""Triton GEMV for packed GGUF weights (every block type): decode and small batches, blocks read as stored.

``y[m] = W[e_m] @ x[m // x_repeat]`` where ``W`` is ``raw`` ``(N, row_bytes)`` (one matrix for every
row) or a stack ``(E, N, row_bytes)`` gathered by ``expert_index[m]`` (MoE decode reads only the
routed experts). Each program owns ``BLOCK_N`` output rows of one output row ``m`` and walks K in
``BLOCK_K`` steps; each step dequantizes its blocks in registers
(:func:`~stagewise.kernels.packed_blocks_triton.block_values`: each row's step is one contiguous run
of bytes, e.g. 576 bytes of Q4_K at ``BLOCK_K = 1024``) and accumulates ``w * x`` in float32, summed
once at the end. The output is in ``x``'s dtype.

Meant for at most :data:`GEMV_MAX_ROWS` output rows (decode; MoE decode's routed rows): every output
row's programs read the weight tile again (from L2 when the rows share a matrix), so beyond that a
dequantized tile and the device's matmul win. It is correct for any number of rows.

Tile configs are a pure function of the type and shape (:func:`config_for`), never autotuned, so
every pipeline stage reduces in the same order. They are unmeasured defaults (shaped like the Q8_0
GEMV's, ``q8_0_gemv_triton``); ``bench/packed_gemv.py`` times candidates inside CUDA graphs.
The values may differ from ``gguf.quants``' in the last bit where the compiler fuses ``d * q + m``
into one FMA; the products' sum differs from a float32 ``x @ W.T`` by summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.gemv_triton import gemv_tile
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import block_tile
from stagewise.kernels.triton_launch import dependent_launch, int32_index, launch_device
from stagewise.weights.quant.packed_types import PACKED, block_elements, row_bytes

GEMV_MAX_ROWS = 16  # output rows (tokens, or routed (token, expert) pairs) the kernel is meant for


@triton.jit
def _input_tile(x_row, k, K):  # type: ignore[no-untyped-def]
    return tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)  # in the weight tile's axes


@triton.jit
def _packed_gemv_kernel(
    x_ptr, w_ptr, y_ptr, e_ptr,
    N, K,
    stride_xm, stride_we, stride_wn, stride_ym,
    x_repeat,
    TYPE: tl.constexpr, GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    rows = w_ptr + e * stride_we + offs_n.to(tl.int64) * stride_wn  # (BN,) each row's first byte
    x_row = x_ptr + xm * stride_xm
    # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
    w_first, kk = block_tile(rows, 0, K, n_mask, TYPE, BLOCK_K)  # (BN, blocks, ...) float32, offsets in K
    if not GATHER:
        wait_for_predecessor(GDC)
    acc = w_first * _input_tile(x_row, kk, K)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w, kk = block_tile(rows, k0, K, n_mask, TYPE, BLOCK_K)
        acc += w * _input_tile(x_row, k0 + kk, K)
    y = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_K)), axis=1)
    tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K is clamped to [the type's block, next_pow2(K)].
# NOTE: unmeasured: the Q8_0 GEMV's shapes of config (q8_0_gemv_triton); bench/packed_gemv.py measures
HEAD_CONFIG = (4, 256, 2, 4)  # LM heads (N * K >= HEAD_MIN_ELEMENTS)
HEAD_MIN_ELEMENTS = 200_000_000
TALL_CONFIG = (2, 1024, 4, 4)  # N > K (fused input projections)
ROW_CONFIG = (1, 2048, 4, 3)  # N <= K (output projections)
GATHER_CONFIG = (4, 512, 4, 3)  # routed experts, K >= 1024
GATHER_SHORT_CONFIG = (4, 256, 2, 4)  # routed experts, short K


def config_for(ggml_type: GGMLQuantizationType, n: int, k: int, gather: bool) -> tuple[int, int, int, int]:
    """The tile config of a ``(n, k)`` weight (``gather``: an expert stack) of ``ggml_type``: a pure
    function of its arguments, so every stage reduces in the same order."""
    if gather:
        block_n, block_k, warps, stages = GATHER_CONFIG if k >= 1024 else GATHER_SHORT_CONFIG
    elif n * k >= HEAD_MIN_ELEMENTS:
        block_n, block_k, warps, stages = HEAD_CONFIG
    else:
        block_n, block_k, warps, stages = TALL_CONFIG if n > k else ROW_CONFIG
    block_k = max(block_elements(ggml_type), min(block_k, triton.next_power_of_2(k)))
    return block_n, block_k, warps, stages


def packed_gemv(x: torch.Tensor, raw: torch.Tensor, ggml_type: GGMLQuantizationType, k: int,
                expert_index: torch.Tensor | None = None, x_repeat: int = 1,
                config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x (M / x_repeat, k)`` (bf16, f16 or f32) -> ``y (M, N)`` in ``x``'s dtype, float32 accumulation.

    ``raw`` uint8 ``(N, row_bytes)`` holds the weight's GGUF rows of ``k`` values of ``ggml_type`` byte
    for byte; a 3-D ``(E, N, row_bytes)`` stack needs ``expert_index (M,)``, the matrix of each output
    row, and output row ``m`` reads input row ``m // x_repeat`` (a token's routed experts share its
    row). ``k`` must be a multiple of the type's block. No host synchronization, output sized by
    shapes only (CUDA graph safe). ``config`` overrides :func:`config_for` (benchmarks only).
    """
    if ggml_type not in PACKED:
        raise ValueError(f"{ggml_type.name} is not a packed block type")
    if raw.dtype != torch.uint8 or raw.dim() not in (2, 3) or raw.stride(-1) != 1:
        raise ValueError("packed_gemv needs uint8 rows (N, row_bytes) or (E, N, row_bytes), bytes contiguous")
    if k % block_elements(ggml_type) or raw.shape[-1] != row_bytes(ggml_type, k):
        raise ValueError(f"{ggml_type.name}: {raw.shape[-1]} bytes per row do not hold {k} values")
    n = raw.shape[-2]
    gather = raw.dim() == 3
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0] * x_repeat
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D packed stack needs one expert index per output row")
    block_n, block_k, warps, stages = config or config_for(ggml_type, n, k, gather)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D
    with launch_device(x):
        _packed_gemv_kernel[(triton.cdiv(n, block_n), m)](
            x2, raw, y, e, n, k,
            x2.stride(0), raw.stride(0) if gather else 0, raw.stride(-2), y.stride(0), x_repeat,
            TYPE=int(ggml_type), GATHER=gather, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y
