"""Packed GEMM for a few rows per weight, on the planes: decode (kernel A) and batched decode (kernel B).

Contract as :func:`~stagewise.kernels.moe_decode_triton.decode_gemm` (``out[s] = A[row(s)] @
W[expert(s)].T`` over an alignment's one-expert row blocks, optionally times the slot's routing
weight, SiLU·up fused for a gate/up stack, K split over programs and summed in split order), for a
packed stack held as planes (:class:`~stagewise.kernels.expert_stacks.PackedStack`) of any packed type.
A dense matrix is a one-expert stack with the identity alignment. Every program owns ``BLOCK_N``
weight rows and every row of its block: the weight tile is the dot's tall side, the rows its narrow
side (swap), so each weight value is read and converted once per launch, whatever the row count.

Each scale group of a K step (32 values; 16 for Q2_K, Q3_K and Q6_K) has values ``v = a * (u - o) + b``
(``u`` the unsigned quant, ``0 <= u < 64``; a codebook entry for IQ4_NL, IQ4_XS and MXFP4) with
per-row ``a``, ``b`` and a constant ``o`` from the block's meta bytes. Two modes (``SCALE_AFTER``):

- **kernel A** (scales after the dot; 1-16 rows, MoE expert blocks): ``u`` becomes ``OFF + u`` in the
  dot's dtype once, exactly (bf16: the bits ``0x4300 | u`` are ``128 + u``; f16: ``0x6400 | u`` is
  ``1024 + u``), one tensor-core dot per group serves all rows, ``P = sum (OFF + u) x``, and the group's
  scales apply once in float32: ``acc += a P + (b - a (OFF + o)) sum(x)``, ``sum(x)`` of the group's
  activations (computed once per program and group). Codebook groups dot the codebook values
  themselves: ``acc += a P``.
- **kernel B** (dequantized; 17-128 rows, and from one row for ``packed_matmul.B_FROM_ONE_ROW``): each value
  ``a * (u - o) + b`` is made once, then dotted: no per-group epilogue, so the cost of a tile does not grow
  with the rows. With bf16 activations, in bf16 from the PTX's ``128 + u``, ``a`` and ``b`` rounded to bf16
  first; else (and without PTX) in float32, rounded to the activation dtype once.

Both accumulate in float32 and match ``x @ dequantize(W).T`` within float tolerance (kernel A reorders the
scales' arithmetic, not the values' rounding; kernel B's float32 form rounds each value once, as the
dequantized tile path does, its bf16 form within about two bf16 roundings: 5.03 SASS instructions a Q4_K
value against 6.99, 3-14 % faster decode of Llama-3.1-8B at 2-64 streams, bench/results/kquant_files/session19).
No atomics except the split-K counters, whose last program sums the partials in split order: results do not
depend on scheduling, and the tiles are a function of the shapes only (staged = single-device). Triton's
interpreter (tests on CPU) runs the float32 form of either mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import PackedStack, check_planes
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.moe_decode_triton import silu_mul_tile, store_tile, tile_counters
from stagewise.kernels.packed_steps_triton import k_step
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device
from stagewise.spec.packed_types import block_elements

_WORD_META = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K)  # meta read as int32 words (packed_steps_triton)
# the quants -> bf16 by inline PTX (else Triton's ops), in kernels A and B: every packed type (Q4_0/1, Q5_0/1, Q2_K,
# Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4; packed_steps_triton.k_step)
NIBBLE_ASM = True


@dataclass(frozen=True)
class PackedTiles:
    """Tiles of one packed few-rows GEMM: ``block_n`` weight rows a program, ``blocks`` 32-value blocks a K
    step (32-value types; a K step is one super-block otherwise), ``split_k`` programs per output tile,
    ``scale_after``: kernel A (else kernel B)."""

    block_n: int
    num_warps: int
    num_stages: int
    scale_after: bool
    blocks: int = 8
    split_k: int = 1


# ------------------------------------------------------------------------------------------------ kernel


@triton.jit
def _packed_decode_kernel(
    a_ptr, qs_ptr, qh_ptr, meta_ptr, out_ptr, route_ptr, part_ptr, lock_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, steps, num_slots, top_k, up_offset, split_k,
    stride_am, stride_qe, stride_qn, stride_he, stride_hn, stride_me, stride_mn, stride_om,
    TYPE: tl.constexpr, BLOCKS: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, GLU: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GDC: tl.constexpr,
):
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_k = pid % split_k  # the K splits of one tile are neighbours: they share the tile's rows
    tile = pid // split_k
    pid_n = tile % n_tiles
    pid_m = tile // n_tiles
    wait_for_predecessor(GDC)  # the alignment and the activations come from earlier kernels
    if pid_m >= tl.load(valid_ptr):
        return  # a padding block past every expert's run
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    slots = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # (BM,)
    row_ok = slots < num_slots
    rows = slots // top_k if GATHER_ROWS else slots
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    # NOTE: rows past N read row N - 1 instead (never stored): the weight loads need no mask, nor zeros for it
    n64 = tl.minimum(offs_n, N - 1).to(tl.int64)
    w_ok = tl.full((BLOCK_N,), True, tl.int1)
    q_rows = qs_ptr + expert * stride_qe + n64 * stride_qn  # (BN,) each weight row's start in each plane
    h_rows = qh_ptr + expert * stride_he + n64 * stride_hn
    m_rows = meta_ptr + expert * stride_me + n64 * stride_mn
    per_split = tl.cdiv(steps, split_k)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, steps)
    # NOTE: kernel B's Q4_K / Q5_K (two wgmma a dot, from registers) run the loop at least once (an empty split runs
    # the last step, its partial zeroed after): a loop that may not run leaves a path where the accumulators are set
    # by other instructions, and ptxas then waits for every wgmma (C7515; the others are not serialized so). Tested on
    # CPU too (the interpreter takes the same path)
    ONCE: tl.constexpr = not SCALE_AFTER and (TYPE == 12 or TYPE == 13)
    start = first
    stop = last
    if ONCE:
        start = tl.minimum(first, steps - 1)
        stop = tl.maximum(last, start + 1)
        tl.assume(stop > start)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(start, stop):
        acc = k_step(acc, q_rows, h_rows, m_rows, step, w_ok, a_ptr, rows, row_ok, stride_am,
                     TYPE, BLOCKS, SCALE_AFTER, DOT, ASM)
        if GLU:  # the matching up rows, up_offset rows further
            acc_up = k_step(acc_up, q_rows + up_offset * stride_qn, h_rows + up_offset * stride_hn,
                            m_rows + up_offset * stride_mn, step, w_ok, a_ptr, rows, row_ok, stride_am,
                            TYPE, BLOCKS, SCALE_AFTER, DOT, ASM)
    if SPLIT:  # split_k > 1 (a runtime count: one compile serves every split)
        if ONCE:
            acc = tl.where(last > first, acc, 0.0)
            acc_up = tl.where(last > first, acc_up, 0.0)
        plane = num_slots * N
        offs = slots[None, :].to(tl.int64) * N + offs_n[:, None]  # the tile's float32 partial in a (num_slots, N) plane
        mask = row_ok[None, :] & n_ok[:, None]
        tl.store(part_ptr + pid_k * plane + offs, acc, mask=mask)
        if GLU:
            tl.store(part_ptr + (split_k + pid_k) * plane + offs, acc_up, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        done = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel")
        if done == split_k - 1:  # the last program of this tile: sum the partials in split order
            tl.debug_barrier()
            acc = tl.zeros(acc.shape, dtype=tl.float32)
            acc_up = tl.zeros(acc.shape, dtype=tl.float32)
            for j in range(0, split_k):
                acc += tl.load(part_ptr + j * plane + offs, mask=mask, other=0.0, cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(part_ptr + (split_k + j) * plane + offs, mask=mask, other=0.0,
                                      cache_modifier=".cg")
            tl.store(lock_ptr + tile, 0)  # zero again for the next launch on this stream
            if GLU:
                acc = silu_mul_tile(acc, acc_up, out_ptr.dtype.element_ty)
            store_tile(acc, out_ptr, route_ptr, slots, row_ok, offs_n, n_ok, stride_om, 1, True, ROUTE_WEIGHT)
    else:
        if GLU:
            acc = silu_mul_tile(acc, acc_up, out_ptr.dtype.element_ty)
        store_tile(acc, out_ptr, route_ptr, slots, row_ok, offs_n, n_ok, stride_om, 1, True, ROUTE_WEIGHT)


def _dot_kind(a: torch.Tensor) -> int:
    """0: float32 dots (float32 activations, and Triton's interpreter, which holds bf16 as raw bits);
    1: bf16; 2: f16."""
    if a.device.type != "cuda" or a.dtype == torch.float32:
        return 0
    if a.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"packed GEMM activations must be float32, bf16 or f16, got {a.dtype}")
    return 1 if a.dtype == torch.bfloat16 else 2


def _launch(a: torch.Tensor, weight: PackedStack, align: MoeAlignment, top_k: int, tiles: PackedTiles,
            n_out: int, up_offset: int, *, gather_rows: bool, glu: bool,
            top_weight: torch.Tensor | None) -> torch.Tensor:
    qs, qh, meta, ggml_type, k_in = weight.qs, weight.qh, weight.meta, weight.ggml_type, weight.in_features
    check_planes(qs, qh, meta, ggml_type, k_in, dims=(3,))
    if ggml_type == GGMLQuantizationType.Q8_0:
        raise ValueError("Q8_0 is resident as Q8_0Weight, with its own GEMMs (kernels/moe_decode_triton.py)")
    if a.shape[-1] != k_in or a.stride(-1) != 1:
        raise ValueError(f"activations need {k_in} contiguous features, got {tuple(a.shape)}")
    super_block = block_elements(ggml_type) == 256
    step = 256 if super_block else 32 * tiles.blocks
    if k_in % step or not k_in:
        raise ValueError(f"{ggml_type.name}: a K step of {step} values must divide {k_in} (at least one step)")
    if ggml_type in _WORD_META and (meta.data_ptr() % 4 or meta.stride(0) % 4 or meta.stride(1) % 4):
        raise ValueError(f"{ggml_type.name}: the meta plane is read as int32 words and must be 4-byte aligned")
    if tiles.split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {tiles.split_k}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out
    n_tiles = cdiv(n_out, tiles.block_n)
    split = tiles.split_k
    if split > 1:
        partials = torch.empty((split * (2 if glu else 1), num_slots, n_out), dtype=torch.float32, device=a.device)
        counters = tile_counters(a.device, num_blocks * n_tiles)
    else:
        partials, counters = out, align.num_valid_blocks  # unused
    qh_arg = qh if qh.shape[-1] else qs  # no high plane: any pointer (never read)
    with launch_device(a):
        _packed_decode_kernel[(num_blocks * n_tiles * split,)](
            a, qs, qh_arg, meta, out, route, partials, counters,
            align.sorted_slots, align.block_expert, align.num_valid_blocks,
            n_out, k_in // step, num_slots, top_k, up_offset, split,
            a.stride(0), qs.stride(0), qs.stride(1), qh_arg.stride(0), qh_arg.stride(1), meta.stride(0), meta.stride(1),
            out.stride(0),
            TYPE=int(ggml_type), BLOCKS=1 if super_block else tiles.blocks, SCALE_AFTER=tiles.scale_after,
            DOT=_dot_kind(a), ASM=NIBBLE_ASM, GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None, GLU=glu, SPLIT=split > 1,
            BLOCK_M=align.block_m, BLOCK_N=tiles.block_n,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **dependent_launch(a),
        )
    return out


def packed_decode_gemm(a: torch.Tensor, weight: PackedStack, align: MoeAlignment, top_k: int, tiles: PackedTiles, *,
                       gather_rows: bool, top_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-slot ``(S, out)`` rows of ``A[row(s)] @ W[expert(s)].T`` for a packed stack ``(E, out, in)`` (module doc)."""
    return _launch(a, weight, align, top_k, tiles, weight.qs.shape[1], 0, gather_rows=gather_rows, glu=False,
                   top_weight=top_weight)


def packed_decode_gemm_glu(a: torch.Tensor, weight: PackedStack, align: MoeAlignment, top_k: int,
                           tiles: PackedTiles, *, gather_rows: bool) -> torch.Tensor:
    """Per-slot ``(S, I)`` rows of ``silu(A[row(s)] @ G.T) * (A[row(s)] @ U.T)`` for a fused ``(E, 2I, in)``
    gate/up stack (gate rows then up rows), each rounded to the activation dtype before the product, as
    ``silu_mul`` of the stored pair."""
    two_i = weight.qs.shape[1]
    if two_i % 2:
        raise ValueError(f"a fused gate/up weight has an even number of rows, got {two_i}")
    return _launch(a, weight, align, top_k, tiles, two_i // 2, two_i // 2, gather_rows=gather_rows, glu=True,
                   top_weight=None)
