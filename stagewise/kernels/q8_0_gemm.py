"""Q8_0 matmul for many tokens in one Triton launch: the grouped GEMM (prefill) or the few-rows decode
GEMM (more rows than ``q8_0.GEMV_MAX_TOKENS``, up to 64: a batched decode step), each with a single "expert".

The reference path (:meth:`Q8_0Weight._tiled_matmul`) dequantizes bounded tiles of the weight to
float32, casts them and calls the device's GEMM: ~6 launches and ~6 bytes of traffic per weight
element. Here :func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` reads the int8 values and
f16 scales once and dequantizes each tile in registers (as ``Q8_0Weight`` does) before ``tl.dot``.
The alignment of ``M`` rows to one expert is the identity, built once per ``(M, block, device)``.
Up to :data:`DECODE_ROWS` rows, :func:`~stagewise.kernels.moe_decode_triton.decode_gemm` reads each
weight tile once for all rows (the rows on the dot's narrow side) and splits K over several programs.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from stagewise.kernels.expert_stacks import Q8_0Tensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.moe_decode_triton import DecodeTiles, decode_gemm, decode_gemm_glu
from stagewise.kernels.moe_grouped_triton import INTERPRETER, TILES_64_Q8_0_GATE_UP, TILES_128, GemmTiles, grouped_gemm

DECODE_ROWS = 64  # up to this many rows (a batched decode step): the few-rows kernel, every row in one block
# `bench/q8_0_decode_sweep.py` (git 1f282a2) on an H200 (q8_0_decode_sweep_h200.json), Qwen3-30B-A3B's dense Q8_0 matmuls:
# 32-output tiles with K split until a launch has 8 programs per row (q/k/v 5120x2048 at 32 rows: 12.1 us,
# o 2048x4096: 10.3 us; 15.3 / 13.8 with the prefill GEMM's 16-row tiles; one TMA box a K step no better);
# wide tiles, unsplit, for a head, one TMA box a K step (151936x2048: 129 us against 147 with a box a
# 32-column group, 293 with the prefill GEMM; 181 against 221 at 64 rows; q8_0_decode_wide_tma3_h200.json)
DENSE_DECODE_TILES = DecodeTiles(block_n=32, block_k=128, num_warps=2, num_stages=3, swap=True, tma=True)
WIDE_DECODE_TILES = DecodeTiles(block_n=128, block_k=128, num_warps=4, num_stages=3, swap=True, tma=True, wide=True)
WIDE_OUTPUTS = 32768  # outputs from which a matrix has tiles enough without splitting K (an output head)
DENSE_PROGRAMS_PER_ROW = 8
# Eight programs a row left a step of 8 rows 64 programs for the 2048-output matrices (out projections, the shared
# expert) on 132 SMs: a floor of 264 (two an H100's or H200's SM) decodes Qwen3.6 Q8_0 at 4 / 8 / 16 streams 18 / 9 /
# 3 % faster on an H100 than none; 132 and 396 within 1 % of it, 528 and 1056 slower; the tiles' block_n, warps,
# stages and K step swept at 8 rows gave nothing better (bench/results/hybrid_serving_h200/session15/)
DENSE_MIN_PROGRAMS = 264  # and K split until a launch has at least this many programs


def _tiles(rows: int, device: torch.device) -> tuple[int, GemmTiles]:
    """``(block_m, tiles)`` of the prefill GEMM: a function of the row count and device kind only."""
    if device.type != "cuda":
        return INTERPRETER.block_m, INTERPRETER.gate_up
    return (128, TILES_128) if rows >= 1024 else (64, TILES_64_Q8_0_GATE_UP)


@functools.cache  # a function of three ints, asked at every launch
def decode_tiles(rows: int, out_features: int, in_features: int) -> tuple[int, DecodeTiles]:
    """``(block_m, tiles)`` of the few-rows kernel for ``rows <= DECODE_ROWS``: every row in one block,
    K split until a launch has :data:`DENSE_PROGRAMS_PER_ROW` programs per row and at least
    :data:`DENSE_MIN_PROGRAMS`. A function of the shapes only, so every stage reduces in the same order."""
    block_m = max(16, 1 << (rows - 1).bit_length())
    tiles = WIDE_DECODE_TILES if out_features >= WIDE_OUTPUTS else DENSE_DECODE_TILES
    block_k = next(k for k in (tiles.block_k, 64, 32) if in_features % k == 0)
    n_tiles = -(-out_features // tiles.block_n)
    steps = in_features // block_k
    split = 1
    programs = max(DENSE_PROGRAMS_PER_ROW * rows, DENSE_MIN_PROGRAMS)
    while n_tiles * split < programs and split * 2 <= steps:
        split *= 2
    return block_m, dataclasses.replace(tiles, block_k=block_k, split_k=split)


def q8_0_gemm(x: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor, glu: bool = False) -> torch.Tensor:
    """``x (..., in) @ W.T`` -> ``(..., out)`` in ``x``'s dtype for a 2-D Q8_0 weight: int8 ``qs`` ``(out, in)``,
    f16 ``scales`` ``(out, in / 32)``. ``glu``: ``W`` is a fused gate/up (gate rows then up rows) and the result
    ``silu(x @ G.T) * (x @ U.T)`` ``(..., out / 2)``, at most :data:`DECODE_ROWS` rows: SiLU·up in the few-rows
    kernel's epilogue with the plain launch's tiles and K split over the whole weight, so each output sums in the
    same order: bit for bit ``silu_mul`` of the plain result, in one launch."""
    out_features, in_features = qs.shape
    a = x.reshape(-1, in_features)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    if glu and rows > DECODE_ROWS:
        raise ValueError(f"the fused gate/up takes at most {DECODE_ROWS} rows, got {rows}")
    stack = Q8_0Tensors(qs[None], scales[None])  # (1, out, in): a view
    if rows <= DECODE_ROWS:  # a batched decode step
        block_m, small = decode_tiles(rows, out_features, in_features)
        launch = decode_gemm_glu if glu else decode_gemm
        y = launch(a, stack, identity_alignment(rows, block_m, a.device), 1, small, gather_rows=False)
    else:
        block_m, tiles = _tiles(rows, a.device)
        y = grouped_gemm(a, stack, identity_alignment(rows, block_m, a.device), 1, tiles, gather_rows=False)
    return y.reshape(*x.shape[:-1], out_features // 2 if glu else out_features)
