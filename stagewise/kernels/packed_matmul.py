"""Packed matmul of 1-128 rows in one launch: kernel A or B over one matrix's planes, tiles by shape.

A 2-D packed weight is a one-expert stack and its rows the identity alignment
(:func:`~stagewise.kernels.moe_align.identity_alignment`); :func:`packed_matmul` runs
:func:`~stagewise.kernels.packed_decode_triton.packed_decode_gemm` with kernel A (scales after the dot)
up to :func:`kernel_a_max_rows` rows in one 16-row block, kernel B (values rounded once) beyond, every row in
one block of the next power of two, so each weight value is converted once per launch. K is split
over programs (summed in split order) until a launch has :data:`PROGRAMS` programs. Every choice is a
function of the device kind, the row count and the shape: staged = single-device, bit for bit.
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import PackedStack, PackedTensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.packed_decode_triton import PackedTiles, packed_decode_gemm, packed_decode_gemm_glu
from stagewise.spec.packed_types import block_elements

A_MAX_ROWS = 16  # kernel A (a tensor-core dot per scale group serves every row) up to this many rows
# types whose kernel B (each value converted once, from the inline PTX's 128 + u) beats kernel A at 2-16 rows, so
# takes them from one row: random Llama-3.1-8B decode on an H100 (bench/results/kquant_files/session17), Q4_K +11 / +5
# / +5 % at 2 / 8 / 16 streams; IQ4_XS lost 13 % at 8 and Q6_K 20-24 % at 2 and 8 (Q5_K: not yet timed)
B_FROM_ONE_ROW = frozenset({GGMLQuantizationType.Q4_K})
# 1: decode expert blocks of B_FROM_ONE_ROW's types take kernel B as well (0: kernel A, the only form timed for experts
# so far). Off until timed end to end: bench/results/kquant_files/session19/call.sh's Qwen3.6 job is its A/B
EXPERT_B_FROM_ONE_ROW = 0
# narrow matrices (at most NARROW_MAX_N weight rows: Llama-3.1-8B's o and down, 4096 rows) of these types at 1-16 rows
# take their kernel (kernel B for Q4_K) in programs of NARROW_TILES (weight rows; warps: two, so Triton's mma.sync;
# pipeline stages), the K split as for BLOCK_N-row tiles. Q4_K on an H100 at 2 / 8 / 16 rows, µs, against the default
# tiles (bench/results/kquant_files/session19): down 25.9 / 27.6 / 29.7 against 38.7 / 40.4 / 42.4, o 11.7 / 12.6 /
# 13.5 against 14.8 / 15.6 / 16.6; qkv (6144 rows: 15.6 / 16.6 / 18.7 against 15.2 / 16.2 / 16.9) and gate/up lose so.
# NARROW_MAX_N 0: never
NARROW_TYPES = frozenset({GGMLQuantizationType.Q4_K})
NARROW_MAX_N = 4096
NARROW_TILES = (32, 2, 3)
B_MAX_ROWS = 128  # kernel B up to this many rows: every row in one block (128 at most)
# measured on an H100 (bench/results/kquant_profile/README.md): the best swept tiles or within 4 % at Llama-8B's
# Q4_K shapes, 8 / 32 / 64 rows, but o and down at 64 rows and Q6_K down at 32 (128 rows a program: 11-25 % faster)
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 2
# (kernel A in fewer than four warps, which Triton compiles to mma.sync instead of wgmma, lost by 4-62 % on an H100
# where kernel A serves: bench/results/kquant_files/session18)
PROGRAMS = 512  # programs a launch is split up to (K split in order): an H200 has 132 SMs
INTERPRETER_BLOCK_N = 16  # Triton's interpreter (tests on CPU): small tiles


def step_blocks(ggml_type: GGMLQuantizationType, k: int, most: int = 8) -> int:
    """32-value blocks a K step holds (at most ``most``, a power of two dividing ``k / 32``); 1 for super-blocks."""
    if block_elements(ggml_type) != 32:
        return 1
    blocks = most
    while (k // 32) % blocks:
        blocks //= 2
    return blocks


def kernel_a_max_rows(ggml_type: GGMLQuantizationType) -> int:
    """Rows up to which a ``ggml_type`` matmul takes kernel A (0: kernel B from one row, :data:`B_FROM_ONE_ROW`)."""
    return 0 if ggml_type in B_FROM_ONE_ROW else A_MAX_ROWS


def narrow(ggml_type: GGMLQuantizationType, n: int) -> bool:
    """Whether a matrix of ``n`` weight rows of ``ggml_type`` takes :data:`NARROW_TILES` at 1-16 rows."""
    return ggml_type in NARROW_TYPES and n <= NARROW_MAX_N


def dense_tiles(rows: int, n: int, k: int, ggml_type: GGMLQuantizationType, device: torch.device) -> tuple[int, PackedTiles]:
    """``(block_m, tiles)`` of a ``(n, k)`` matrix at ``rows`` rows (at most :data:`B_MAX_ROWS`)."""
    if not 0 < rows <= B_MAX_ROWS:
        raise ValueError(f"the packed few-rows GEMM takes 1-{B_MAX_ROWS} rows, got {rows}")
    scale_after = rows <= kernel_a_max_rows(ggml_type)
    block_m = max(16, 1 << (rows - 1).bit_length())
    blocks = step_blocks(ggml_type, k)
    if device.type != "cuda":
        return block_m, PackedTiles(INTERPRETER_BLOCK_N, 4, 1, scale_after, blocks)
    steps = k // (256 if block_elements(ggml_type) == 256 else 32 * blocks)
    n_tiles = -(-n // BLOCK_N)
    split = 1
    while n_tiles * split < PROGRAMS and split * 2 <= steps:
        split *= 2
    block_n, warps, stages = NARROW_TILES if rows <= A_MAX_ROWS and narrow(ggml_type, n) else (
        BLOCK_N, NUM_WARPS, NUM_STAGES)
    return block_m, PackedTiles(block_n, warps, stages, scale_after, blocks, split)


def expert_tiles(ggml_type: GGMLQuantizationType, k: int, device: torch.device, scale_after: bool = True) -> PackedTiles:
    """Kernel A's (``scale_after``, unless :data:`EXPERT_B_FROM_ONE_ROW` sends the type to kernel B) or B's tiles for
    expert blocks (one launch has programs enough: no split)."""
    scale_after = scale_after and not (EXPERT_B_FROM_ONE_ROW and ggml_type in B_FROM_ONE_ROW)
    blocks = step_blocks(ggml_type, k)
    if device.type != "cuda":
        return PackedTiles(INTERPRETER_BLOCK_N, 4, 1, scale_after, blocks)
    return PackedTiles(BLOCK_N, NUM_WARPS, NUM_STAGES, scale_after, blocks)


def packed_matmul(x: torch.Tensor, weight: PackedStack) -> torch.Tensor:
    """``x (..., in) @ W.T`` -> ``(..., out)`` in ``x``'s dtype for a 2-D packed weight (planes ``(out, bytes)``),
    1-128 rows."""
    return _launch(x, weight, glu=False)


def packed_matmul_glu(x: torch.Tensor, weight: PackedStack) -> torch.Tensor:
    """``silu(x @ G.T) * (x @ U.T)`` -> ``(..., I)`` for a fused 2-D gate/up weight (``2I`` rows: gate then up),
    1-128 rows (:class:`~stagewise.weights.quant.packed_weight.PackedWeight` sends at most ``GLU_MAX_ROWS``): the
    kernel :func:`packed_matmul` takes, with SiLU·up in its epilogue, each program a tile of gate rows and the
    matching up rows, with the tiles and K split :func:`packed_matmul` takes for the whole weight, so bit for bit
    ``silu_mul(packed_matmul(x, weight))`` in one launch."""
    return _launch(x, weight, glu=True)


def _launch(x: torch.Tensor, weight: PackedStack, *, glu: bool) -> torch.Tensor:
    out_features, in_features = weight.qs.shape[0], weight.in_features
    a = x.reshape(-1, in_features)
    if a.stride(-1) != 1:
        a = a.contiguous()
    rows = a.shape[0]
    block_m, tiles = dense_tiles(rows, out_features, in_features, weight.ggml_type, a.device)
    stack = PackedTensors(weight.qs[None], weight.qh[None], weight.meta[None], weight.ggml_type, in_features)  # views
    align = identity_alignment(rows, block_m, a.device)
    if glu:
        return packed_decode_gemm_glu(a, stack, align, 1, tiles, gather_rows=False).reshape(
            *x.shape[:-1], out_features // 2)
    y = packed_decode_gemm(a, stack, align, 1, tiles, gather_rows=False)
    return y.reshape(*x.shape[:-1], out_features)
