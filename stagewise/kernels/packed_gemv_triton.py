"""Triton GEMV for packed GGUF weights (every block type): decode and small batches, blocks read as stored.

``y[m] = W[e_m] @ x[m // x_repeat]`` where ``W`` is a packed matrix ``(N, K)`` (one matrix for every
row) or a stack ``(E, N, K)`` gathered by ``expert_index[m]`` (MoE decode reads only the routed
experts), held as planes (:class:`~stagewise.kernels.expert_stacks.PackedStack`). Each program owns
``BLOCK_N`` output rows of one output row ``m`` and walks K in ``BLOCK_K`` steps; each step dequantizes
its blocks in registers (:func:`~stagewise.kernels.packed_blocks_triton.block_values`: each row's step
is one contiguous run of quant bytes, e.g. 512 bytes of Q4_K at ``BLOCK_K = 1024``) and accumulates
``w * x`` in float32, summed once at the end. Q4_K and Q5_K (:data:`SLOT_TYPES`) are read by 8-byte
slots instead, whose 8 + 8 inputs are contiguous, so the input loads share the quant bytes' layout;
each 32-value sub-block's ``scale * sum(q x) - min * sum(x)`` is accumulated, its scales read as the
four 32-bit words of the block's 16 meta bytes. The output is in ``x``'s dtype.

Meant for at most :data:`GEMV_MAX_ROWS` output rows (decode; MoE decode's routed rows): every output
row's programs read the weight tile again (from L2 when the rows share a matrix), so beyond that a
dequantized tile and the device's matmul win. It is correct for any number of rows.

Tile configs are a pure function of the type and shape (:func:`config_for`), never autotuned, so
every pipeline stage reduces in the same order; ``bench/packed_gemv.py`` times candidates inside CUDA
graphs (Q4_K, Q5_K and Q6_K measured, the other types' defaults not).
The values may differ from ``gguf.quants``' in the last bit where the compiler fuses ``d * q + m``
into one FMA; the products' sum differs from a float32 ``x @ W.T`` by summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import PackedStack, check_planes
from stagewise.kernels.gemv_triton import gemv_grid, gemv_tile
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import block_tile, k_word_scales
from stagewise.kernels.triton_launch import dependent_launch, int32_index, launch_device, next_power_of_2
from stagewise.kernels.word_gemv_triton import int32_rows, words_config, words_gemv
from stagewise.spec.packed_types import block_elements

# types whose GEMV reads 8-byte slots and applies scales once a sub-block
SLOT_TYPES = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K})
GEMV_MAX_ROWS = 16  # output rows (tokens, or routed (token, expert) pairs) the kernel is meant for


@triton.jit
def _input_tile(x_row, k, K):  # type: ignore[no-untyped-def]
    return tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)  # in the weight tile's axes


@triton.jit
def _k_slots(q_rows, h_rows, meta32_rows, k0, K, n_mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q4_K / Q5_K super-blocks by 8-byte slots: quant bytes ``32c + 8g + l`` ``(BN, NB, 4, 4, 8)``
    (chunk ``c``, slot ``g``), Q5_K's high-bit bytes ``8g + l`` of the same values (zeros for Q4_K), and
    the scale and min of sub-blocks ``2c`` and ``2c + 1`` ``(BN, NB, 4, 1)`` each.

    A slot's 8 bytes hold values ``64c + 8g + l`` (low nibbles) and ``64c + 32 + 8g + l`` (high): 8
    contiguous inputs each, so the input loads take the quant bytes' layout (one thread, one slot)."""
    b = k0 // 256 + tl.arange(0, NB)
    mask = n_mask[:, None] & (b < K // 256)[None, :]  # (BN, NB)
    m5 = mask[:, :, None, None, None]
    qb = q_rows[:, None] + b[None, :] * 128  # (BN, NB) each super-block's 128 quant bytes
    c = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 4)[None, None, None, :, None]
    l8 = tl.arange(0, 8)[None, None, None, None, :]
    quants = tl.load(qb[:, :, None, None, None] + 32 * c + 8 * g + l8, mask=m5, other=0).to(tl.int32)
    if TYPE == 13:
        hb = h_rows[:, None] + b[None, :] * 32  # (BN, NB) its 32 high-bit bytes
        high = tl.load(hb[:, :, None, None, None] + 8 * g + l8 + 0 * c, mask=m5, other=0).to(tl.int32)
    else:
        high = tl.zeros((1, 1, 1, 1, 1), dtype=tl.int32)
    head = meta32_rows[:, None] + b[None, :] * 4  # (BN, NB) its 16 meta bytes as 32-bit words
    w0 = tl.load(head, mask=mask, other=0)[:, :, None, None]  # d, dmin
    w1 = tl.load(head + 1, mask=mask, other=0)[:, :, None, None]  # scale bytes 0-3
    w2 = tl.load(head + 2, mask=mask, other=0)[:, :, None, None]  # 4-7
    w3 = tl.load(head + 3, mask=mask, other=0)[:, :, None, None]  # 8-11
    scale0, min0, scale1, min1 = k_word_scales(w0, w1, w2, w3, tl.arange(0, 4)[None, None, :, None])
    return quants, high, scale0, scale1, min0, min1


@triton.jit
def _k_dot(quants, high, scale0, scale1, min0, min1, x_row, k0, K, TYPE: tl.constexpr,
           NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of a Q4_K / Q5_K GEMV from :func:`_k_slots`: ``scale * sum(q * x) - min * sum(x)`` of
    each slot's two sub-blocks, ``(BN, NB, 4, 4)`` (summed over the rest at the end)."""
    b = k0 // 256 + tl.arange(0, NB)[None, :, None, None, None]
    c = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 4)[None, None, None, :, None]
    l8 = tl.arange(0, 8)[None, None, None, None, :]
    at = b * 256 + 64 * c + 8 * g + l8  # (1, NB, 4, 4, 8) the low nibbles' inputs
    in_k = b < K // 256  # constant along a slot, so the loads stay vectors
    x0 = tl.load(x_row + at, mask=in_k, other=0.0).to(tl.float32)
    x1 = tl.load(x_row + at + 32, mask=in_k, other=0.0).to(tl.float32)
    q0 = quants & 15
    q1 = quants >> 4
    if TYPE == 13:
        q0 = q0 | (((high >> (2 * c)) & 1) << 4)
        q1 = q1 | (((high >> (2 * c + 1)) & 1) << 4)
    dot0 = tl.sum(q0.to(tl.float32) * x0, axis=4)
    dot1 = tl.sum(q1.to(tl.float32) * x1, axis=4)
    sum0 = tl.sum(x0, axis=4)
    sum1 = tl.sum(x1, axis=4)
    return scale0 * dot0 - min0 * sum0 + scale1 * dot1 - min1 * sum1


@triton.jit
def _packed_gemv_kernel(
    x_ptr, qs_ptr, qh_ptr, meta_ptr, meta32_ptr, y_ptr, e_ptr,
    N, K,
    stride_xm, stride_qe, stride_qn, stride_he, stride_hn, stride_me, stride_mn, stride_ym,
    x_repeat,
    TYPE: tl.constexpr, SLOTS: tl.constexpr, GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    n64 = offs_n.to(tl.int64)
    q_rows = qs_ptr + e * stride_qe + n64 * stride_qn  # (BN,) each row's first byte in each plane
    h_rows = qh_ptr + e * stride_he + n64 * stride_hn
    m_rows = meta_ptr + e * stride_me + n64 * stride_mn
    x_row = x_ptr + xm * stride_xm
    if SLOTS:  # Q4_K / Q5_K by 8-byte slots, scales applied once a sub-block
        NB: tl.constexpr = BLOCK_K // 256
        meta32_rows = meta32_ptr + (e * stride_me + n64 * stride_mn) // 4  # the same meta rows as 32-bit words
        # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
        qs, hs, s0, s1, n0, n1 = _k_slots(q_rows, h_rows, meta32_rows, 0, K, n_mask, TYPE, NB)
        if not GATHER:
            wait_for_predecessor(GDC)
        part = _k_dot(qs, hs, s0, s1, n0, n1, x_row, 0, K, TYPE, NB)  # (BN, NB, 4, 4)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            qs, hs, s0, s1, n0, n1 = _k_slots(q_rows, h_rows, meta32_rows, k0, K, n_mask, TYPE, NB)
            part += _k_dot(qs, hs, s0, s1, n0, n1, x_row, k0, K, TYPE, NB)
        y = tl.sum(tl.reshape(part, (BLOCK_N, NB * 16)), axis=1)
    else:
        w_first, kk = block_tile(q_rows, h_rows, m_rows, 0, K, n_mask, TYPE, BLOCK_K)  # (BN, blocks, ...) float32
        if not GATHER:
            wait_for_predecessor(GDC)
        acc = w_first * _input_tile(x_row, kk, K)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w, kk = block_tile(q_rows, h_rows, m_rows, k0, K, n_mask, TYPE, BLOCK_K)
            acc += w * _input_tile(x_row, k0 + kk, K)
        y = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_K)), axis=1)
    tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K is clamped to [the type's block, next_pow2(K)].
# Measured inside CUDA graphs on an H200 at Llama-3.1-8B's shapes (bench/packed_gemv.py ->
# bench/results/packed_h200_r2/packed_gemv_slots_h200.json): (wide, narrow) = the best where N > K
# or the matrix is an LM head, and where N <= K.
T = GGMLQuantizationType
CONFIGS = {
    T.Q4_K: ((4, 1024, 2, 3), (2, 2048, 4, 3)),  # slots: gate/up 29.3 us (1.13 TB/s), head 1.31 TB/s
    T.Q5_K: ((1, 1024, 2, 3), (1, 2048, 4, 3)),  # slots
    T.Q6_K: ((1, 4096, 4, 2), (1, 2048, 4, 3)),  # bytes: 0.74-0.84 TB/s
}
BYTES_CONFIG = (2, 1024, 2, 3)  # the other types (unmeasured): the byte path's best for Q4_K and Q5_K
HEAD_MIN_ELEMENTS = 200_000_000
SLOT_GATHER_CONFIG = (2, 1024, 2, 3)  # routed experts of a slot type: Qwen3-30B-A3B@q4_k decode 254 -> 318 tok/s
GATHER_CONFIG = (4, 512, 4, 3)  # routed experts, K >= 1024
GATHER_SHORT_CONFIG = (4, 256, 2, 4)  # routed experts, short K


def config_for(ggml_type: GGMLQuantizationType, n: int, k: int, gather: bool) -> tuple[int, int, int, int]:
    """The tile config of a ``(n, k)`` weight (``gather``: an expert stack) of ``ggml_type``: a pure
    function of its arguments, so every stage reduces in the same order."""
    if gather and ggml_type in SLOT_TYPES:
        block_n, block_k, warps, stages = SLOT_GATHER_CONFIG
    elif gather:
        block_n, block_k, warps, stages = GATHER_CONFIG if k >= 1024 else GATHER_SHORT_CONFIG
    elif ggml_type in CONFIGS:
        wide, narrow = CONFIGS[ggml_type]
        block_n, block_k, warps, stages = wide if n > k or n * k >= HEAD_MIN_ELEMENTS else narrow
    else:
        block_n, block_k, warps, stages = BYTES_CONFIG
    block_k = max(block_elements(ggml_type), min(block_k, next_power_of_2(k)))
    return block_n, block_k, warps, stages


def packed_gemv(x: torch.Tensor, weight: PackedStack, expert_index: torch.Tensor | None = None, x_repeat: int = 1,
                config: tuple[int, int, int, int] | None = None, slots: bool = True,
                word_config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``x (M / x_repeat, K)`` (bf16, f16 or f32) -> ``y (M, N)`` in ``x``'s dtype, float32 accumulation.

    ``weight``'s planes hold a packed ``(N, K)`` matrix, or a ``(E, N, K)`` stack, which needs
    ``expert_index (M,)``, the matrix of each output row; output row ``m`` reads input row ``m //
    x_repeat`` (a token's routed experts share its row). No host synchronization, output sized by
    shapes only (CUDA graph safe). Q4_K, Q5_K, Q6_K and IQ4_XS with bf16 input take the word GEMV
    (:mod:`~stagewise.kernels.word_gemv_triton`) where its ``words_config`` has a config. ``config``
    overrides :func:`config_for` (and the word GEMV), ``word_config`` the word GEMV's own, and
    ``slots=False`` turns the word GEMV and the slot path of :data:`SLOT_TYPES` off (benchmarks only).
    """
    qs, qh, meta, ggml_type, k = weight.qs, weight.qh, weight.meta, weight.ggml_type, weight.in_features
    check_planes(qs, qh, meta, ggml_type, k)
    n = qs.shape[-2]
    gather = qs.dim() == 3
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0] * x_repeat
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D packed stack needs one expert index per output row")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    words = words_config(ggml_type, k, gather, x.dtype) if slots and config is None else None
    if words is not None and word_config is not None:
        words = word_config
    if words is not None:
        words_gemv(x2, weight, y, words, int32_index(expert_index) if gather and expert_index is not None else None,
                   x_repeat)
        return y
    block_n, block_k, warps, stages = config or config_for(ggml_type, n, k, gather)
    use_slots = slots and ggml_type in SLOT_TYPES
    if use_slots and not int32_rows(meta, 16):  # the path is a function of type and shape only: never switch on an address
        raise ValueError(f"{ggml_type.name} meta rows must start 16-byte aligned with strides a multiple of 4 bytes")
    meta32 = meta.view(torch.int32) if use_slots else meta  # the super-blocks' 16 meta bytes as 32-bit words
    qh_arg = qh if qh.shape[-1] else qs  # no high plane: any pointer (never read)
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D

    def strides(p: torch.Tensor) -> tuple[int, int]:
        return (p.stride(0) if gather else 0), p.stride(-2)

    with launch_device(x):
        _packed_gemv_kernel[gemv_grid(n, block_n, m)](
            x2, qs, qh_arg, meta, meta32, y, e, n, k,
            x2.stride(0), *strides(qs), *strides(qh_arg), *strides(meta), y.stride(0), x_repeat,
            TYPE=int(ggml_type), SLOTS=use_slots, GATHER=gather, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y
