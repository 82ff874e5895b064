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
- **kernel B** (dequantized; 17-128 rows): each value ``a * (u - o) + b`` is computed in float32 and
  rounded to the activation dtype once, then dotted: no per-group epilogue, so the cost of a tile does
  not grow with the rows.

Both accumulate in float32 and match ``x @ dequantize(W).T`` within float tolerance (the scales'
arithmetic is reordered, not the values' rounding: kernel B rounds each value once, as the dequantized
tile path does). No atomics except the split-K counters, whose last program sums the partials in split
order: results do not depend on scheduling, and the tiles are a function of the shapes only
(staged = single-device). Triton's interpreter (tests on CPU) runs the float32 form of either mode.
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
from stagewise.kernels.packed_blocks_triton import (
    FP4_HI,
    FP4_LO,
    IQ4_HI,
    IQ4_LO,
    codebook,
    load_f16,
    load_u8,
    signed_byte,
)
from stagewise.kernels.triton_launch import dependent_launch, launch_device
from stagewise.spec.packed_types import block_elements

SUPER_TYPES = frozenset({10, 11, 12, 13, 14, 23})  # 256-value super-blocks (type ids)
NIBBLE_ASM = True  # kernel A's Q4_0, Q4_1, Q4_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4 bytes -> bf16 by inline PTX (else Triton's ops)


def _nibbles5_asm(bit: int) -> str:
    """PTX for :func:`_nibbles5_bf16`: as :func:`_nibbles_bf16`, each value's fifth bit from bit ``bit`` (low
    nibbles) and ``bit + 1`` (high nibbles) of the matching high-bit byte, moved to bit 4 of its 16-bit lane."""
    def move(b: int, dst: str, src: str) -> str:
        return f"shl.b32 {dst}, {src}, {4 - b};" if b <= 4 else f"shr.u32 {dst}, {src}, {b - 4};"

    lines = ["{", ".reg .b32 t0, t1, h0, h1, a0, a1, m0, m1;",
             "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;",
             "prmt.b32 h0, $5, 0, 0x4140;", "prmt.b32 h1, $5, 0, 0x4342;"]
    for out, b, shift in ((0, bit, ""), (2, bit + 1, "shr.u32 t0, t0, 4; shr.u32 t1, t1, 4;")):
        lines += [shift, "lop3.b32 m0, t0, 0x000f000f, 0x43004300, 0xea;", "lop3.b32 m1, t1, 0x000f000f, 0x43004300, 0xea;",
                  move(b, "a0", "h0"), move(b, "a1", "h1"),
                  f"lop3.b32 ${out}, a0, 0x00100010, m0, 0xea;", f"lop3.b32 ${out + 1}, a1, 0x00100010, m1, 0xea;"]
    return "\n".join([*lines, "}"])


def _codebook_asm(values: tuple[int, ...]) -> str:
    """PTX for :func:`_codebook_bf16`: the 16 entries' bf16 bit patterns as two byte tables (low and high
    bytes, eight entries a ``prmt`` pair); per four nibbles, the selector ``n0 | n1 << 4 | n2 << 8 | n3 << 12``,
    two lookups a table, the right half per byte by the index's bit 3 (``prmt`` sign-replicating ``n << 4``),
    and the bytes interleaved into bf16 pairs."""
    import struct

    bits = [struct.unpack("<I", struct.pack("<f", float(v)))[0] >> 16 for v in values]  # exact: small integers
    assert all(float(struct.unpack("<f", struct.pack("<I", b << 16))[0]) == v for b, v in zip(bits, values, strict=True))

    def word(entries: list[int]) -> str:
        return f"0x{sum(e << (8 * i) for i, e in enumerate(entries)):08x}"

    lo = [b & 0xFF for b in bits]
    hi = [b >> 8 for b in bits]
    tables = {"l0": word(lo[0:4]), "l1": word(lo[4:8]), "l2": word(lo[8:12]), "l3": word(lo[12:16]),
              "h0": word(hi[0:4]), "h1": word(hi[4:8]), "h2": word(hi[8:12]), "h3": word(hi[12:16])}
    lines = ["{", ".reg .b32 n, c, s, m, a, b, l, h, t0, t1, t2, t3;"]
    for out, nibble in ((0, "and.b32 n, $4, 0x0f0f0f0f;"), (2, "shr.u32 n, $4, 4; and.b32 n, n, 0x0f0f0f0f;")):
        lines += [nibble, "shr.u32 c, n, 4;", "or.b32 c, c, n;", "prmt.b32 s, c, 0, 0x4420;", "and.b32 s, s, 0x7777;",
                  "shl.b32 m, n, 4;", "prmt.b32 m, m, 0, 0xba98;"]
        for reg, name in (("l", "l"), ("h", "h")):
            lines += [f"mov.b32 t0, {tables[name + '0']};", f"mov.b32 t1, {tables[name + '1']};",
                      f"mov.b32 t2, {tables[name + '2']};", f"mov.b32 t3, {tables[name + '3']};",
                      "prmt.b32 a, t0, t1, s;", "prmt.b32 b, t2, t3, s;", f"lop3.b32 {reg}, a, b, m, 0xd8;"]
        lines += [f"prmt.b32 ${out}, l, h, 0x5140;", f"prmt.b32 ${out + 1}, l, h, 0x7362;"]
    return "\n".join([*lines, "}"])


IQ4_ASM: tl.constexpr = tl.constexpr(_codebook_asm((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                                                    113)))  # gguf IQ4_NL.kvalues
FP4_ASM: tl.constexpr = tl.constexpr(_codebook_asm((0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)))  # MXFP4
NIBBLES_ASM: tl.constexpr = tl.constexpr("\n".join([
    "{", ".reg .b32 t0, t1;", "prmt.b32 t0, $4, 0, 0x4140;", "prmt.b32 t1, $4, 0, 0x4342;",
    "lop3.b32 $0, t0, 0x000f000f, 0x43004300, 0xea;", "lop3.b32 $1, t1, 0x000f000f, 0x43004300, 0xea;",
    "shr.u32 t0, t0, 4;", "shr.u32 t1, t1, 4;",
    "lop3.b32 $2, t0, 0x000f000f, 0x43004300, 0xea;", "lop3.b32 $3, t1, 0x000f000f, 0x43004300, 0xea;", "}"]))
Q5K_ASM0: tl.constexpr = tl.constexpr(_nibbles5_asm(0))  # Q5_K chunk c: sub-blocks 2c, 2c + 1 -> bits 2c, 2c + 1
Q5K_ASM1: tl.constexpr = tl.constexpr(_nibbles5_asm(2))
Q5K_ASM2: tl.constexpr = tl.constexpr(_nibbles5_asm(4))
Q5K_ASM3: tl.constexpr = tl.constexpr(_nibbles5_asm(6))


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


# ------------------------------------------------------------------------------------------------ groups


@triton.jit
def _x_group(a_ptr, rows, row_ok, k, stride_am, GS: tl.constexpr, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """The group's activations ``(GS, BM)`` in the dot's dtype (DOT 0: float32, 1: bf16, 2: f16)."""
    x = tl.load(a_ptr + rows[None, :] * stride_am + (k + tl.arange(0, GS))[:, None], mask=row_ok[None, :], other=0.0)
    if DOT == 0:
        x = x.to(tl.float32)
    return x


@triton.jit
def _magic(u, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``OFF + u`` in the dot's dtype, exactly (``0 <= u < 64``): bf16 ``0x4300 | u``, f16 ``0x6400 | u``."""
    if DOT == 1:
        w = (u | 0x4300).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif DOT == 2:
        w = (u | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True)
    else:
        w = (u + 128).to(tl.float32)
    return w


@triton.jit
def _nibbles_bf16(q):  # type: ignore[no-untyped-def]
    """Bytes ``q`` (uint8) -> ``(128 + (q & 15), 128 + (q >> 4))`` as bf16, exactly: four bytes at a time, two
    ``prmt`` spread them into 16-bit lanes and each ``lop3`` makes two values (``(t & 0x000f000f) | 0x43004300``)."""
    return tl.inline_asm_elementwise(asm=NIBBLES_ASM, constraints="=r,=r,=r,=r,r", args=[q],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _nibbles5_bf16(q, h, TEXT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Bytes ``q`` and high-bit bytes ``h`` (uint8) -> ``128 + u`` as bf16 for the low and the high nibbles, each
    with its fifth bit from ``h`` (``TEXT``: one of ``Q5K_ASM*``, which bits)."""
    return tl.inline_asm_elementwise(asm=TEXT, constraints="=r,=r,=r,=r,r,r", args=[q, h],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _codebook_bf16(q, TEXT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Bytes ``q`` (uint8) -> the codebook entries of their low and high nibbles as bf16 (``TEXT``: ``IQ4_ASM`` or
    ``FP4_ASM``), four bytes at a time by ``prmt`` table lookups."""
    return tl.inline_asm_elementwise(asm=TEXT, constraints="=r,=r,=r,=r,r", args=[q],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _dot(w, x, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    if DOT == 0:
        p = tl.dot(w, x, input_precision="ieee")
    else:
        p = tl.dot(w, x)
    return p


@triton.jit
def _linear_group(acc, u, x, a, b, CENTER: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr,
                  SYMMETRIC: tl.constexpr = False):  # type: ignore[no-untyped-def]
    """``acc (BN, BM) += W_g @ x`` for the group's values ``a * (u - CENTER) + b`` (``u`` ``(BN, GS)`` int32,
    ``a``/``b`` ``(BN,)`` float32; ``SYMMETRIC``: ``b`` is zero)."""
    if SCALE_AFTER:
        OFF: tl.constexpr = 1024 if DOT == 2 else 128
        if SYMMETRIC:  # u - CENTER exactly in the dot's dtype: the magic value less OFF + CENTER (small integers)
            p = _dot(_magic(u, DOT) - (OFF + CENTER), x, DOT)  # (BN, BM) = sum (u - CENTER) x
            acc += a[:, None] * p
        else:
            p = _dot(_magic(u, DOT), x, DOT)  # (BN, BM) = sum (OFF + u) x
            sx = _dot(tl.full(u.shape, 1.0, x.dtype), x, DOT)  # (BN, BM): every row sum(x), on the tensor cores
            acc += a[:, None] * p
            acc += (b - a * (OFF + CENTER))[:, None] * sx
    else:
        w = a[:, None] * (u - CENTER).to(tl.float32) + b[:, None]
        acc = tl.dot(w.to(x.dtype), x, acc, input_precision="ieee") if DOT == 0 else tl.dot(w.to(x.dtype), x, acc)
    return acc


@triton.jit
def _magic_group(acc, w, x, a, b, CENTER: tl.constexpr):  # type: ignore[no-untyped-def]
    """Kernel A's group step from ``w = bf16(128 + u)`` already made (bf16 activations):
    ``acc += a P + (b - a (128 + CENTER)) sum(x)``."""
    p = tl.dot(w, x)
    sx = tl.dot(tl.full(w.shape, 1.0, tl.bfloat16), x)
    acc += a[:, None] * p
    acc += (b - a * (128 + CENTER))[:, None] * sx
    return acc


@triton.jit
def _codebook_group(acc, c, x, a, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc += W_g @ x`` for the group's values ``a * c`` (``c`` ``(BN, GS)`` the codebook entries, int32)."""
    if SCALE_AFTER:
        acc += a[:, None] * _dot(c.to(x.dtype), x, DOT)
    else:
        w = a[:, None] * c.to(tl.float32)
        acc = tl.dot(w.to(x.dtype), x, acc, input_precision="ieee") if DOT == 0 else tl.dot(w.to(x.dtype), x, acc)
    return acc


# ------------------------------------------------------------------------------------------------ blocks


@triton.jit
def _small_block(acc, q_rows, h_rows, m_rows, blk, n_ok, a_ptr, rows, row_ok, stride_am,  # type: ignore[no-untyped-def]
                 TYPE: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr):
    """One 32-value block (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): byte ``l`` holds values ``l`` (low nibble)
    and ``16 + l`` (high)."""
    l16 = tl.arange(0, 16)[None, :]
    x_lo = _x_group(a_ptr, rows, row_ok, blk * 32, stride_am, 16, DOT)
    x_hi = _x_group(a_ptr, rows, row_ok, blk * 32 + 16, stride_am, 16, DOT)
    m = m_rows + blk * (1 if TYPE == 39 else 4 if TYPE == 3 or TYPE == 7 else 2)
    if ASM and (TYPE == 2 or TYPE == 3):  # Q4_0 / Q4_1: both nibbles of a byte into bf16 at once, by inline PTX
        lo_w, hi_w = _nibbles_bf16(tl.load(q_rows[:, None] + blk * 16 + l16, mask=n_ok[:, None], other=0))
        d = load_f16(m, n_ok)
        if TYPE == 2:  # d * (q - 8): 128 + q less 136, exactly
            acc += d[:, None] * tl.dot(lo_w - 136.0, x_lo, tl.dot(hi_w - 136.0, x_hi))
        else:  # d * q + m
            ones = tl.full(lo_w.shape, 1.0, tl.bfloat16)
            acc += d[:, None] * tl.dot(lo_w, x_lo, tl.dot(hi_w, x_hi))
            acc += (load_f16(m + 2, n_ok) - 128.0 * d)[:, None] * tl.dot(ones, x_lo, tl.dot(ones, x_hi))
        return acc
    if ASM and (TYPE == 20 or TYPE == 39):  # IQ4_NL / MXFP4: the codebook values of both nibbles, by inline PTX
        text: tl.constexpr = IQ4_ASM if TYPE == 20 else FP4_ASM
        lo_w, hi_w = _codebook_bf16(tl.load(q_rows[:, None] + blk * 16 + l16, mask=n_ok[:, None], other=0), text)
        if TYPE == 20:
            d = load_f16(m, n_ok)
        else:
            e = load_u8(m, n_ok)
            d = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)
        acc += d[:, None] * tl.dot(lo_w, x_lo, tl.dot(hi_w, x_hi))
        return acc
    q = load_u8(q_rows[:, None] + blk * 16 + l16, n_ok[:, None])  # (BN, 16)
    lo = q & 15
    hi = q >> 4
    if TYPE == 39:  # MXFP4: E8M0 exponent (ggml_e8m0_to_fp32_half), e2m1 codes doubled
        e = load_u8(m, n_ok)
        d = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)
        acc = _codebook_group(acc, codebook(lo, FP4_LO, FP4_HI), x_lo, d, SCALE_AFTER, DOT)
        acc = _codebook_group(acc, codebook(hi, FP4_LO, FP4_HI), x_hi, d, SCALE_AFTER, DOT)
    elif TYPE == 20:  # IQ4_NL
        d = load_f16(m, n_ok)
        acc = _codebook_group(acc, codebook(lo, IQ4_LO, IQ4_HI), x_lo, d, SCALE_AFTER, DOT)
        acc = _codebook_group(acc, codebook(hi, IQ4_LO, IQ4_HI), x_hi, d, SCALE_AFTER, DOT)
    else:
        d = load_f16(m, n_ok)
        if TYPE == 6 or TYPE == 7:  # the fifth bit of value j is bit j of the block's 32-bit qh word
            hb = h_rows + blk * 4
            word = (load_u8(hb, n_ok) | (load_u8(hb + 1, n_ok) << 8) | (load_u8(hb + 2, n_ok) << 16)
                    | (load_u8(hb + 3, n_ok) << 24))[:, None]
            lo = lo | (((word >> l16) & 1) << 4)
            hi = hi | (((word >> (l16 + 16)) & 1) << 4)
        if TYPE == 3 or TYPE == 7:  # d * q + m
            b = load_f16(m + 2, n_ok)
            acc = _linear_group(acc, lo, x_lo, d, b, 0, SCALE_AFTER, DOT)
            acc = _linear_group(acc, hi, x_hi, d, b, 0, SCALE_AFTER, DOT)
        else:  # d * (q - 8), d * (q - 16)
            zero = tl.zeros_like(d)
            center: tl.constexpr = 16 if TYPE == 6 else 8
            acc = _linear_group(acc, lo, x_lo, d, zero, center, SCALE_AFTER, DOT, True)
            acc = _linear_group(acc, hi, x_hi, d, zero, center, SCALE_AFTER, DOT, True)
    return acc


@triton.jit
def _k_scale(m, n_ok, s: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block ``s`` from the 12 bytes at ``m + 4``."""
    if s < 4:
        sc = load_u8(m + 4 + s, n_ok) & 63
        mn = load_u8(m + 8 + s, n_ok) & 63
    else:
        md = load_u8(m + 8 + s, n_ok)
        sc = (md & 15) | ((load_u8(m + s, n_ok) >> 6) << 4)
        mn = (md >> 4) | ((load_u8(m + 4 + s, n_ok) >> 6) << 4)
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _super_block(acc, q_rows, h_rows, m_rows, blk, n_ok, a_ptr, rows, row_ok, stride_am,  # type: ignore[no-untyped-def]
                 TYPE: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr):
    """One 256-value super-block (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) at K index ``256 blk``."""
    k0 = blk * 256
    l16 = tl.arange(0, 16)[None, :]
    l32 = tl.arange(0, 32)[None, :]
    if TYPE == 12 or TYPE == 13:  # Q4_K / Q5_K: chunk c's 32 bytes: sub-block 2c (low nibbles), 2c + 1 (high)
        m = m_rows + blk * 16
        d = load_f16(m, n_ok)
        dmin = load_f16(m + 2, n_ok)
        if TYPE == 13 and not ASM:
            qh = load_u8(h_rows[:, None] + blk * 32 + l32, n_ok[:, None])  # (BN, 32): bit s is sub-block s's fifth bit
        if TYPE == 13 and ASM:
            qh8 = tl.load(h_rows[:, None] + blk * 32 + l32, mask=n_ok[:, None], other=0)  # (BN, 32) uint8
        for c in tl.static_range(4):
            if ASM:  # both nibbles of a byte into bf16 at once, by inline PTX (module doc)
                qb = tl.load(q_rows[:, None] + blk * 128 + 32 * c + l32, mask=n_ok[:, None], other=0)  # (BN, 32) uint8
                if TYPE == 12:
                    lo, hi = _nibbles_bf16(qb)
                elif c == 0:
                    lo, hi = _nibbles5_bf16(qb, qh8, Q5K_ASM0)
                elif c == 1:
                    lo, hi = _nibbles5_bf16(qb, qh8, Q5K_ASM1)
                elif c == 2:
                    lo, hi = _nibbles5_bf16(qb, qh8, Q5K_ASM2)
                else:
                    lo, hi = _nibbles5_bf16(qb, qh8, Q5K_ASM3)
                for h in tl.static_range(2):
                    sc, mn = _k_scale(m, n_ok, 2 * c + h)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 64 * c + 32 * h, stride_am, 32, DOT)
                    acc = _magic_group(acc, lo if h == 0 else hi, x, d * sc, -(dmin * mn), 0)
            else:
                q = load_u8(q_rows[:, None] + blk * 128 + 32 * c + l32, n_ok[:, None])  # (BN, 32)
                for h in tl.static_range(2):
                    u = (q >> (4 * h)) & 15
                    if TYPE == 13:
                        u = u | (((qh >> (2 * c + h)) & 1) << 4)
                    sc, mn = _k_scale(m, n_ok, 2 * c + h)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 64 * c + 32 * h, stride_am, 32, DOT)
                    acc = _linear_group(acc, u, x, d * sc, -(dmin * mn), 0, SCALE_AFTER, DOT)
    elif TYPE == 14:  # Q6_K: half hf, low bytes 16r + l: values 16r + l (low nibble), 64 + 16r + l (high)
        m = m_rows + blk * 18
        d = load_f16(m + 16, n_ok)
        zero = tl.zeros_like(d)
        for hf in tl.static_range(2):
            for r in tl.static_range(4):
                ql = load_u8(q_rows[:, None] + blk * 128 + 64 * hf + 16 * r + l16, n_ok[:, None])  # (BN, 16)
                qh = load_u8(h_rows[:, None] + blk * 64 + 32 * hf + 16 * (r % 2) + l16, n_ok[:, None])
                for h in tl.static_range(2):
                    u = ((ql >> (4 * h)) & 15) | (((qh >> (4 * h + 2 * (r // 2))) & 3) << 4)
                    sc = signed_byte(load_u8(m + 8 * hf + 4 * h + r, n_ok)).to(tl.float32)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 128 * hf + 64 * h + 16 * r, stride_am, 16, DOT)
                    acc = _linear_group(acc, u, x, d * sc, zero, 32, SCALE_AFTER, DOT, True)
    elif TYPE == 10 or TYPE == 11:  # Q2_K / Q3_K: half hf, byte 16g + l, field s: value 32s + 16g + l
        m = m_rows + blk * (20 if TYPE == 10 else 14)
        if TYPE == 10:
            d = load_f16(m + 16, n_ok)
            dmin = load_f16(m + 18, n_ok)
        else:
            d = load_f16(m + 12, n_ok)
            zero = tl.zeros_like(d)
        for hf in tl.static_range(2):
            for g in tl.static_range(2):
                q = load_u8(q_rows[:, None] + blk * 64 + 32 * hf + 16 * g + l16, n_ok[:, None])  # (BN, 16)
                if TYPE == 11:
                    hm = load_u8(h_rows[:, None] + blk * 32 + 16 * g + l16, n_ok[:, None])
                for s in tl.static_range(4):
                    u = (q >> (2 * s)) & 3
                    i = 8 * hf + 2 * s + g  # the 16-value scale (a constexpr: NOTE not annotated, reassigned each unrolled step)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 128 * hf + 32 * s + 16 * g, stride_am, 16, DOT)
                    if TYPE == 10:
                        sc = load_u8(m + i, n_ok)
                        acc = _linear_group(acc, u, x, d * (sc & 15).to(tl.float32),
                                            -(dmin * (sc >> 4).to(tl.float32)), 0, SCALE_AFTER, DOT)
                    else:  # q = q2 - 4 (1 - high bit) = u - 4 with u = q2 | high << 2
                        u = u | (((hm >> (4 * hf + s)) & 1) << 2)
                        low = (load_u8(m + (i & 7), n_ok) >> (4 * (i >> 3))) & 15
                        high = (load_u8(m + 8 + (i & 3), n_ok) >> (2 * (i >> 2))) & 3
                        dl = d * ((low | (high << 4)) - 32).to(tl.float32)
                        acc = _linear_group(acc, u, x, dl, zero, 4, SCALE_AFTER, DOT, True)
    else:  # IQ4_XS: sub-block sb's 16 bytes: values 32 sb + l (low nibble), 32 sb + 16 + l (high)
        m = m_rows + blk * 8
        d = load_f16(m, n_ok)
        high_bits = load_u8(m + 2, n_ok) | (load_u8(m + 3, n_ok) << 8)
        for sb in tl.static_range(8):
            low = (load_u8(m + 4 + sb // 2, n_ok) >> (4 * (sb % 2))) & 15
            dl = d * ((low | (((high_bits >> (2 * sb)) & 3) << 4)) - 32).to(tl.float32)
            if ASM:  # the codebook values of both nibbles, by inline PTX
                qb = tl.load(q_rows[:, None] + blk * 128 + 16 * sb + l16, mask=n_ok[:, None], other=0)  # (BN, 16) uint8
                lo_w, hi_w = _codebook_bf16(qb, IQ4_ASM)
                x_lo = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb, stride_am, 16, DOT)
                x_hi = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb + 16, stride_am, 16, DOT)
                acc += dl[:, None] * tl.dot(lo_w, x_lo, tl.dot(hi_w, x_hi))
            else:
                q = load_u8(q_rows[:, None] + blk * 128 + 16 * sb + l16, n_ok[:, None])  # (BN, 16)
                for h in tl.static_range(2):
                    x = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb + 16 * h, stride_am, 16, DOT)
                    acc = _codebook_group(acc, codebook((q >> (4 * h)) & 15, IQ4_LO, IQ4_HI), x, dl, SCALE_AFTER, DOT)
    return acc


@triton.jit
def _k_step(acc, q_rows, h_rows, m_rows, step, n_ok, a_ptr, rows, row_ok, stride_am,  # type: ignore[no-untyped-def]
            TYPE: tl.constexpr, BLOCKS: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr):
    """``acc (BN, BM) +=`` one K step: a super-block, or ``BLOCKS`` 32-value blocks."""
    if TYPE == 10 or TYPE == 11 or TYPE == 12 or TYPE == 13 or TYPE == 14 or TYPE == 23:
        acc = _super_block(acc, q_rows, h_rows, m_rows, step, n_ok, a_ptr, rows, row_ok, stride_am,
                           TYPE, SCALE_AFTER, DOT, ASM and SCALE_AFTER and DOT == 1 and (TYPE == 12 or TYPE == 13 or TYPE == 23))
    else:
        for j in tl.static_range(BLOCKS):
            acc = _small_block(acc, q_rows, h_rows, m_rows, step * BLOCKS + j, n_ok, a_ptr, rows, row_ok, stride_am,
                               TYPE, SCALE_AFTER, DOT,
                               ASM and SCALE_AFTER and DOT == 1 and (TYPE == 2 or TYPE == 3 or TYPE == 20 or TYPE == 39))
    return acc


# ------------------------------------------------------------------------------------------------ kernel


@triton.jit
def _packed_decode_kernel(
    a_ptr, qs_ptr, qh_ptr, meta_ptr, out_ptr, route_ptr, part_ptr, lock_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, steps, num_slots, top_k, up_offset,
    stride_am, stride_qe, stride_qn, stride_he, stride_hn, stride_me, stride_mn, stride_om,
    TYPE: tl.constexpr, BLOCKS: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, GLU: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GDC: tl.constexpr,
):
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_k = pid % SPLIT_K  # the K splits of one tile are neighbours: they share the tile's rows
    tile = pid // SPLIT_K
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
    n64 = offs_n.to(tl.int64)
    q_rows = qs_ptr + expert * stride_qe + n64 * stride_qn  # (BN,) each weight row's start in each plane
    h_rows = qh_ptr + expert * stride_he + n64 * stride_hn
    m_rows = meta_ptr + expert * stride_me + n64 * stride_mn
    per_split = tl.cdiv(steps, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, steps)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(first, last):
        acc = _k_step(acc, q_rows, h_rows, m_rows, step, n_ok, a_ptr, rows, row_ok, stride_am,
                      TYPE, BLOCKS, SCALE_AFTER, DOT, ASM)
        if GLU:  # the matching up rows, up_offset rows further
            acc_up = _k_step(acc_up, q_rows + up_offset * stride_qn, h_rows + up_offset * stride_hn,
                             m_rows + up_offset * stride_mn, step, n_ok, a_ptr, rows, row_ok, stride_am,
                             TYPE, BLOCKS, SCALE_AFTER, DOT, ASM)
    if SPLIT_K > 1:
        plane = num_slots * N
        offs = slots[None, :].to(tl.int64) * N + offs_n[:, None]  # the tile's float32 partial in a (num_slots, N) plane
        mask = row_ok[None, :] & n_ok[:, None]
        tl.store(part_ptr + pid_k * plane + offs, acc, mask=mask)
        if GLU:
            tl.store(part_ptr + (SPLIT_K + pid_k) * plane + offs, acc_up, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        done = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:  # the last program of this tile: sum the partials in split order
            tl.debug_barrier()
            acc = tl.zeros(acc.shape, dtype=tl.float32)
            acc_up = tl.zeros(acc.shape, dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):
                acc += tl.load(part_ptr + j * plane + offs, mask=mask, other=0.0, cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(part_ptr + (SPLIT_K + j) * plane + offs, mask=mask, other=0.0,
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
    if k_in % step:
        raise ValueError(f"{ggml_type.name}: a K step of {step} values must divide {k_in}")
    if tiles.split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {tiles.split_k}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out
    n_tiles = triton.cdiv(n_out, tiles.block_n)
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
            n_out, k_in // step, num_slots, top_k, up_offset,
            a.stride(0), qs.stride(0), qs.stride(1), qh_arg.stride(0), qh_arg.stride(1), meta.stride(0), meta.stride(1),
            out.stride(0),
            TYPE=int(ggml_type), BLOCKS=1 if super_block else tiles.blocks, SCALE_AFTER=tiles.scale_after,
            DOT=_dot_kind(a), ASM=NIBBLE_ASM, GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None, GLU=glu, SPLIT_K=split,
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
