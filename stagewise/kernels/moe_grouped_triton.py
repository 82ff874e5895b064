"""Grouped MoE GEMM (Triton): the prefill path of a MoE layer, and the many-rows matmul of one matrix.

Contract. After :func:`~stagewise.kernels.moe_align.moe_align` has sorted the ``S = N * K`` routed
slots (``slot = token * K + k``) into ``BLOCK_M``-row blocks of one expert each,
:func:`grouped_gemm` computes for every slot ``s``

    ``out[s] = A[row(s)] @ W[expert(s)].T`` (times ``top_weight.flatten()[s]`` when ``route_weight``)

where ``row(s) = s // K`` when ``gather_rows`` (A is the tokens' ``x (N, in)``) and ``row(s) = s``
otherwise (A is already per slot, ``(S, in)``). ``W`` is a dense stack ``(E, out, in)`` (bf16 / f16 /
f32), Q8_0 (``qs`` int8 ``(E, out, in)`` + ``scales`` f16 ``(E, out, in / 32)``; value = ``qs *
scale`` of its 32-element block) or packed GGUF blocks (:mod:`stagewise.kernels.expert_stacks`).
One program owns ``BLOCK_M`` sorted slots x ``BLOCK_N`` outputs; it dequantizes each weight tile in
registers exactly as :class:`~stagewise.weights.quant.q8_0.Q8_0Weight` does (``(qs * scale)`` in
float32, rounded to the activation dtype), feeds ``tl.dot`` and accumulates in float32. Programs past
the valid blocks return at once; rows of padding slots are never written. The whole SwiGLU experts
on it are :func:`~stagewise.kernels.moe_experts.grouped_swiglu_experts`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stagewise.kernels.expert_stacks import (
    ExpertWeight,
    PackedStack,
    as_packed,
    check_planes,
    stack_shape,
    values_and_scales,
)
from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.packed_blocks_triton import block_values
from stagewise.kernels.triton_launch import cdiv, launch_device
from stagewise.spec.packed_types import block_elements

QBLOCK = 32  # elements per Q8_0 block: BLOCK_K must be a multiple of it


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr, route_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, K, num_slots, top_k, num_blocks,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk, stride_om, stride_on,
    qh_ptr, meta_ptr, stride_he, stride_hn, stride_me, stride_mn,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, Q8_0: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PACKED: tl.constexpr = 0,
):
    # PACKED: a ggml type id (0: none): w_ptr, qh_ptr and meta_ptr hold each row's planes, dequantized a K step at a time
    # grouped program order: GROUP_M row blocks walk the N tiles together (weight tiles stay in L2)
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    if pid_m >= tl.load(valid_ptr):
        return  # a padding block past every expert's run
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ptr + offs_m)  # (BM,) the capacity is a whole number of blocks
    row_ok = slots < num_slots
    if GATHER_ROWS:
        rows = slots // top_k
    else:
        rows = slots
    rows = tl.where(row_ok, rows, 0).to(tl.int64)  # (BM,) padding reads row 0 (masked anyway)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BM, BK)
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None] * stride_wk
    s_row = s_ptr + expert * stride_se + offs_n[None, :].to(tl.int64) * stride_sn  # (1, BN): this K step's 1st block
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    n64 = offs_n.to(tl.int64)
    q_rows = w_ptr + expert * stride_we + n64 * stride_wn  # (BN,) row starts in each plane (PACKED)
    h_rows = qh_ptr + expert * stride_he + n64 * stride_hn
    m_rows = meta_ptr + expert * stride_me + n64 * stride_mn
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if PACKED != 0:  # the K step's blocks dequantized in registers, (BK, BN) in the activation dtype
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.trans(block_values(q_rows, h_rows, m_rows, k0 * BLOCK_K, K, n_ok, PACKED, BLOCK_N, BLOCK_K)).to(a.dtype)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :], other=0)  # (BK, BN)
        else:
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        if Q8_0 and PACKED == 0:
            # the (BK/32, BN) scales of this K step, each repeated over its 32 rows: one load per scale
            # (measured 1.4-1.6x faster on an H200 than gathering a (BK, BN) tile of scale addresses)
            groups = tl.arange(0, BLOCK_K // 32)
            g_ok = groups < (K - k0 * BLOCK_K + 31) // 32
            sg = tl.load(s_row + groups[:, None] * stride_sk, mask=g_ok[:, None] & n_ok[None, :], other=0.0)
            s = tl.reshape(tl.broadcast_to(sg[:, None, :], (BLOCK_K // 32, 32, BLOCK_N)), (BLOCK_K, BLOCK_N))
            w = (w.to(tl.float32) * s.to(tl.float32)).to(a.dtype)  # as Q8_0Weight dequantizes
        elif PACKED == 0:
            w = w.to(a.dtype)
        if UPCAST:  # NOTE: the interpreter holds bf16 as raw uint16 and multiplies it wrongly
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
        s_row += (BLOCK_K // 32) * stride_sk
    if ROUTE_WEIGHT:
        route = tl.load(route_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)  # (BM,)
        acc = acc * route[:, None]
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class GemmTiles:
    """Tile shape and launch settings of one grouped GEMM (``BLOCK_M`` is the alignment's)."""

    block_n: int
    block_k: int  # a multiple of 32 (one Q8_0 block)
    num_warps: int
    num_stages: int
    group_m: int = 8


@dataclass(frozen=True)
class GroupedConfig:
    """``block_m`` (shared: one alignment feeds both GEMMs) and the tiles of each grouped GEMM."""

    block_m: int
    gate_up: GemmTiles
    down: GemmTiles


# H200 defaults, from `bench/moe_grouped.py --sweep` (Qwen3-30B-A3B and Qwen3.6-35B-A3B experts, 512 and
# 2048 tokens): 64-row blocks, 128-row blocks once experts average >= 64 slots; the Q8_0 gate_up GEMM
# prefers the wider K step (its dequantization is amortized over more of each dot); 16/32-row blocks
# measured 1.5-2x slower
TILES_64 = GemmTiles(block_n=128, block_k=64, num_warps=4, num_stages=4)
TILES_64_Q8_0_GATE_UP = GemmTiles(block_n=128, block_k=128, num_warps=8, num_stages=3)
TILES_128 = GemmTiles(block_n=128, block_k=64, num_warps=8, num_stages=3)
# batched decode (at most 4 routed slots per expert on average, Q8_0): 16-row blocks, narrow tiles, more
# programs; `bench/moe_grouped.py --sweep --tokens 4,8,16,32,64` on an H200 (moe_decode_sweep_h200.json):
# 32 tokens of Qwen3-30B-A3B 0.67 ms vs 0.93 ms with the 64-row prefill tiles (eager, launches included)
TILES_DECODE = GemmTiles(block_n=64, block_k=128, num_warps=2, num_stages=4)
# small tiles for Triton's interpreter (tests on CPU)
INTERPRETER = GroupedConfig(16, GemmTiles(32, 32, 4, 1, 2), GemmTiles(32, 32, 4, 1, 2))


# packed stacks: a K step of 256 values (a K-quant super-block; eight 32-value blocks otherwise),
# NOTE: unmeasured defaults (bench/moe_grouped.py measures); BLOCK_K must divide K
TILES_PACKED = GemmTiles(block_n=64, block_k=256, num_warps=8, num_stages=2)
INTERPRETER_PACKED = GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=1, group_m=2)


def packed_tiles(device: torch.device, weight: PackedStack | None, k: int) -> GemmTiles:
    """Tiles of a grouped GEMM over a packed stack: a function of the device kind, type and K only."""
    tiles = TILES_PACKED if device.type == "cuda" else INTERPRETER_PACKED
    step = tiles.block_k
    while step > 32 and (k % step or (weight is not None and step < block_elements(weight.ggml_type))):
        step //= 2
    return dataclasses.replace(tiles, block_k=step)


def grouped_gemm(a: torch.Tensor, weight: ExpertWeight, align: MoeAlignment, top_k: int, tiles: GemmTiles, *,
                 gather_rows: bool, top_weight: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-slot ``(S, out)`` rows of ``A[row(s)] @ W[expert(s)].T`` (see the module doc).

    ``a``: ``(N, in)`` when ``gather_rows`` (row ``s // top_k``), else ``(S, in)`` (row ``s``).
    ``top_weight`` ``(N, K)``, if given, scales row ``s`` by ``top_weight.flatten()[s]``.
    """
    packed = as_packed(weight)
    if packed is not None:
        check_planes(packed.qs, packed.qh, packed.meta, packed.ggml_type, packed.in_features, dims=(3,))
        values, scales = packed.qs, None
        qh = packed.qh if packed.qh.shape[-1] else packed.qs  # no high plane: any pointer (never read)
        meta = packed.meta
        if tiles.block_k % block_elements(packed.ggml_type) or packed.in_features % tiles.block_k:
            raise ValueError(f"{packed.ggml_type.name}: BLOCK_K {tiles.block_k} must divide K and hold whole blocks")
    else:
        values, scales = values_and_scales(weight)
        qh = meta = values  # unused
    _, n_out, k_in = stack_shape(weight)
    if a.shape[-1] != k_in:
        raise ValueError(f"activations have {a.shape[-1]} features, the experts take {k_in}")
    if scales is not None and tiles.block_k % QBLOCK:
        raise ValueError(f"Q8_0 needs BLOCK_K a multiple of {QBLOCK}, got {tiles.block_k}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=out_dtype or a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out  # (S,), unused if None
    s_ptr = scales if scales is not None else values  # unused for a dense stack
    s_strides = scales.stride() if scales is not None else (0, 0, 0)
    grid = (num_blocks * cdiv(n_out, tiles.block_n),)
    with launch_device(a):
        _grouped_gemm_kernel[grid](
            a, values, s_ptr, out, route,
            align.sorted_slots, align.block_expert, align.num_valid_blocks,
            n_out, k_in, num_slots, top_k, num_blocks,
            a.stride(0), a.stride(1), values.stride(0), values.stride(1), 1 if packed is not None else values.stride(2),
            s_strides[0], s_strides[1], s_strides[2], out.stride(0), out.stride(1),
            qh, meta, qh.stride(0), qh.stride(1), meta.stride(0), meta.stride(1),
            GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None, Q8_0=scales is not None,
            EVEN_K=k_in % tiles.block_k == 0, UPCAST=a.device.type != "cuda",  # off CUDA: the interpreter
            BLOCK_M=align.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
            PACKED=int(packed.ggml_type) if packed is not None else 0,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return out
