"""In-register dequantization of GGUF blocks, for every packed type: one source, the type a constexpr.

:func:`block_values` reads the K step's blocks of ``BLOCK_N`` rows and returns their float32 values
``(BLOCK_N, BLOCK_K)``, in K order, computed with ``gguf.quants``' operations in the same order
(bit-identical when the launch disables FMA contraction, ``enable_fp_fusion=False``). ``TYPE`` is
the ggml type id (``GGMLQuantizationType``'s value); ``BLOCK_K`` is a power of two and a multiple of
the type's block (32 values; 256 for the K-quants and IQ4_XS).

Each row's bytes are read once, as contiguous runs (a super-block's 32-128-byte quant runs), and the
2, 4 or 8 values a byte holds are unpacked by broadcasting shifts over an extra axis; scales are a
few small gathers per block. The 16-entry codebooks of IQ4_NL, IQ4_XS and MXFP4 are two int64
constants (eight signed bytes each) indexed by shifting, not a table in memory.
"""

from __future__ import annotations

import triton
import triton.language as tl

# TYPE ids: Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q2_K 10, Q3_K 11, Q4_K 12, Q5_K 13, Q6_K 14, IQ4_NL 20,
# IQ4_XS 23, MXFP4 39 (GGMLQuantizationType's values)


def _packed_bytes(values: tuple[int, ...]) -> int:
    """Eight signed bytes as one signed int64, value ``i`` in bits ``8i .. 8i + 7``."""
    word = sum((v & 0xFF) << (8 * i) for i, v in enumerate(values))
    return word - (1 << 64) if word >= 1 << 63 else word


_IQ4_KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # gguf IQ4_NL.kvalues
_FP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # gguf MXFP4.kvalues (e2m1, doubled)
IQ4_LO: tl.constexpr = tl.constexpr(_packed_bytes(_IQ4_KVALUES[:8]))
IQ4_HI: tl.constexpr = tl.constexpr(_packed_bytes(_IQ4_KVALUES[8:]))
FP4_LO: tl.constexpr = tl.constexpr(_packed_bytes(_FP4_KVALUES[:8]))
FP4_HI: tl.constexpr = tl.constexpr(_packed_bytes(_FP4_KVALUES[8:]))


@triton.jit
def _plane_bytes(TYPE: tl.constexpr):  # type: ignore[no-untyped-def]
    """``(qs, qh, meta)`` bytes a block of ``TYPE`` has in each plane (spec/packed_types.PLANES)."""
    QS: tl.constexpr = (128 if TYPE == 12 or TYPE == 13 or TYPE == 14 or TYPE == 23 else 64 if TYPE == 10 or TYPE == 11
                        else 32 if TYPE == 8 else 16)
    QH: tl.constexpr = 4 if TYPE == 6 or TYPE == 7 else 32 if TYPE == 11 or TYPE == 13 else 64 if TYPE == 14 else 0
    META: tl.constexpr = (2 if TYPE == 2 or TYPE == 6 or TYPE == 8 or TYPE == 20 else 4 if TYPE == 3 or TYPE == 7
                          else 20 if TYPE == 10 else 14 if TYPE == 11 else 16 if TYPE == 12 or TYPE == 13
                          else 18 if TYPE == 14 else 8 if TYPE == 23 else 1)
    return QS, QH, META


@triton.jit
def load_u8(ptr, mask):  # type: ignore[no-untyped-def]
    return tl.load(ptr, mask=mask, other=0).to(tl.int32)


@triton.jit
def load_f16(ptr, mask):  # type: ignore[no-untyped-def]
    """The little-endian f16 at ``ptr`` (any alignment), as float32."""
    bits = load_u8(ptr, mask) | (load_u8(ptr + 1, mask) << 8)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def load_u32(ptr, mask):  # type: ignore[no-untyped-def]
    """The little-endian 32-bit word at ``ptr`` (any alignment), as int32 (Q5_0 / Q5_1's high bits)."""
    return load_u8(ptr, mask) | (load_u8(ptr + 1, mask) << 8) | (load_u8(ptr + 2, mask) << 16) | (load_u8(ptr + 3, mask) << 24)


@triton.jit
def signed_byte(byte):  # type: ignore[no-untyped-def]
    return (byte ^ 0x80) - 0x80


@triton.jit
def codebook(q, LO: tl.constexpr, HI: tl.constexpr):  # type: ignore[no-untyped-def]
    """Entry ``q`` (0-15, int32) of a 16-value signed-byte codebook held as two int64 words."""
    word = tl.where(q < 8, tl.full(q.shape, LO, tl.int64), tl.full(q.shape, HI, tl.int64))
    return signed_byte(((word >> ((q & 7) * 8).to(tl.int64)) & 0xFF).to(tl.int32))


@triton.jit
def _blocks(qs_rows, qh_rows, meta_rows, blk0, nblk, n_mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """The ``NB`` blocks from ``blk0``: their starts in each plane ``(BN, NB)`` and mask (row and block in range)."""
    QS, QH, META = _plane_bytes(TYPE)
    b = blk0 + tl.arange(0, NB)[None, :]
    return (qs_rows[:, None] + b * QS, qh_rows[:, None] + b * QH, meta_rows[:, None] + b * META,
            n_mask[:, None] & (b < nblk))


@triton.jit
def _halves(qs_rows, qh_rows, meta_rows, blk0, nblk, n_mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q2_K / Q3_K / Q6_K in 128-value halves: each half's block starts ``(BN, 2NB)``, its mask, which half."""
    QS, QH, META = _plane_bytes(TYPE)
    hb = 2 * blk0 + tl.arange(0, 2 * NB)
    b = (hb // 2)[None, :]
    return (qs_rows[:, None] + b * QS, qh_rows[:, None] + b * QH, meta_rows[:, None] + b * META,
            n_mask[:, None] & (b < nblk), hb % 2)


@triton.jit
def _small_block(qb, hb, mb, mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """32-value blocks ``(BN, NB)`` -> values ``(BN, NB, 2, 16)``: value ``16h + l`` of each block."""
    h = tl.arange(0, 2)[None, None, :, None]
    l16 = tl.arange(0, 16)[None, None, None, :]
    q4 = qb[:, :, None, None]
    m4 = mask[:, :, None, None]
    kk = tl.arange(0, NB)[None, :, None, None] * 32 + h * 16 + l16
    if TYPE == 8:  # Q8_0: d | 32 int8
        q = signed_byte(load_u8(q4 + h * 16 + l16, m4))
        v = q.to(tl.float32) * load_f16(mb, mask)[:, :, None, None]
    elif TYPE == 39:  # MXFP4: E8M0 exponent | 16 bytes of e2m1 pairs
        e = load_u8(mb, mask)
        d = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)  # ggml_e8m0_to_fp32_half
        q = (load_u8(q4 + l16, m4) >> (4 * h)) & 0x0F
        v = d[:, :, None, None] * codebook(q, FP4_LO, FP4_HI).to(tl.float32)
    else:
        # d (Q4_0, IQ4_NL), d and m (Q4_1), d and 4 bytes of high bits (Q5_0), or all three (Q5_1) | 16 quant bytes
        q = (load_u8(q4 + l16, m4) >> (4 * h)) & 0x0F  # (BN, NB, 2, 16)
        d = load_f16(mb, mask)[:, :, None, None]
        if TYPE == 6 or TYPE == 7:
            qh = load_u32(hb, mask)
            q = q | (((qh[:, :, None, None] >> (h * 16 + l16)) & 1) << 4)
        if TYPE == 2:
            v = d * (q - 8).to(tl.float32)
        elif TYPE == 20:
            v = d * codebook(q, IQ4_LO, IQ4_HI).to(tl.float32)
        elif TYPE == 6:
            v = d * (q - 16).to(tl.float32)
        else:  # Q4_1, Q5_1
            v = (d * q.to(tl.float32)) + load_f16(mb + 2, mask)[:, :, None, None]
    return v, kk


@triton.jit
def _k_scale_min(base, mask, s):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block ``s`` (any shape) from the 12 bytes at 4."""
    lo = s < 4
    i = s & 3
    a = load_u8(base + 4 + i, mask)
    m = load_u8(base + 8 + i, mask)
    md = load_u8(base + 12 + i, mask)
    sc = tl.where(lo, a & 0x3F, (md & 0x0F) | ((a >> 2) & 0x30))
    mn = tl.where(lo, m & 0x3F, (md >> 4) | ((m >> 2) & 0x30))
    return sc, mn


@triton.jit
def k_word_scales(w0, w1, w2, w3, c):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: a super-block's 16 meta bytes as four int32 words (d and dmin, then the 12 scale bytes) ->
    chunk ``c``'s sub-blocks ``2c`` and ``2c + 1`` (any shape): ``(d scale, dmin min)`` of each, float32."""
    d = ((w0 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    dmin = (((w0 >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    sh = 16 * (c & 1)  # sub-blocks 2c, 2c + 1: scale bytes (2c) & 3 and (2c + 1) & 3 of each word
    lo = c < 2
    a0 = (w1 >> sh) & 0xFF
    a1 = (w1 >> (sh + 8)) & 0xFF
    m0 = (w2 >> sh) & 0xFF
    m1 = (w2 >> (sh + 8)) & 0xFF
    e0 = (w3 >> sh) & 0xFF
    e1 = (w3 >> (sh + 8)) & 0xFF
    scale0 = d * tl.where(lo, a0 & 0x3F, (e0 & 0x0F) | ((a0 >> 2) & 0x30)).to(tl.float32)
    scale1 = d * tl.where(lo, a1 & 0x3F, (e1 & 0x0F) | ((a1 >> 2) & 0x30)).to(tl.float32)
    min0 = dmin * tl.where(lo, m0 & 0x3F, (e0 >> 4) | ((m0 >> 2) & 0x30)).to(tl.float32)
    min1 = dmin * tl.where(lo, m1 & 0x3F, (e1 >> 4) | ((m1 >> 2) & 0x30)).to(tl.float32)
    return scale0, min0, scale1, min1


@triton.jit
def _q45_k(qb, hb, mb, mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K super-blocks ``(BN, NB)`` -> ``(BN, NB, 4, 2, 32)``: value ``64c + 32h + l``, sub-block ``2c + h``.
    Meta: d, dmin, 12 scale bytes (the file's first 16 bytes); Q5_K's 32 high-bit bytes in the high plane."""
    c = tl.arange(0, 4)[None, None, :, None]
    l32 = tl.arange(0, 32)[None, None, None, :]
    h = tl.arange(0, 2)[None, None, None, :, None]
    s = 2 * tl.arange(0, 4)[:, None] + tl.arange(0, 2)[None, :]  # (4, 2)
    m4 = mask[:, :, None, None]
    q = (load_u8(qb[:, :, None, None] + c * 32 + l32, m4)[:, :, :, None, :] >> (4 * h)) & 0x0F
    if TYPE == 13:
        qh = load_u8(hb[:, :, None] + tl.arange(0, 32)[None, None, :], mask[:, :, None])  # (BN, NB, 32)
        q = q | (((qh[:, :, None, None, :] >> s[None, None, :, :, None]) & 1) << 4)
    sc, mn = _k_scale_min(mb[:, :, None, None], m4, s[None, None, :, :])  # (BN, NB, 4, 2)
    scale = load_f16(mb, mask)[:, :, None, None] * sc.to(tl.float32)
    offset = load_f16(mb + 2, mask)[:, :, None, None] * mn.to(tl.float32)
    kk = tl.arange(0, NB)[None, :, None, None, None] * 256 + c[:, :, :, None, :] * 64 + h * 32 + l32[:, :, :, None, :]
    return scale[:, :, :, :, None] * q.to(tl.float32) - offset[:, :, :, :, None], kk


@triton.jit
def _q23_k(qb, hb, mb, mask, half, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q2_K / Q3_K halves ``(BN, 2NB)`` -> ``(BN, 2NB, 4, 2, 16)``: value ``32s + 16g + l`` of the half,
    2-bit field ``s`` of quant byte ``16g + l``; 16-value scale ``8 half + 2s + g``."""
    s = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 2)[None, None, :, None]
    l16 = tl.arange(0, 16)[None, None, None, :]
    m4 = mask[:, :, None, None]
    hf = half[None, :, None, None]
    q = (load_u8(qb[:, :, None, None] + hf * 32 + g * 16 + l16, m4)[:, :, None, :, :] >> (2 * s)) & 3  # (BN, 2NB, 4, 2, 16)
    i = hf * 8 + 2 * tl.arange(0, 4)[None, None, :, None] + tl.arange(0, 2)[None, None, None, :]  # (1, 2NB, 4, 2)
    mb4 = mb[:, :, None, None]
    if TYPE == 10:  # Q2_K: meta = 16 scale bytes (4-bit scale, 4-bit min), d, dmin
        sc = load_u8(mb4 + i, m4)
        dl = load_f16(mb + 16, mask)[:, :, None, None] * (sc & 0x0F).to(tl.float32)
        ml = load_f16(mb + 18, mask)[:, :, None, None] * (sc >> 4).to(tl.float32)
        v = dl[:, :, :, :, None] * q.to(tl.float32) - ml[:, :, :, :, None]
    else:  # Q3_K: 32 bytes of high bits (high plane); meta = 12 bytes of 6-bit scales, d
        hm = load_u8(hb[:, :, None, None] + g * 16 + l16, m4)  # (BN, 2NB, 2, 16): the same bytes for both halves
        bit = hf[:, :, :, :, None] * 4 + s
        q = q - ((((hm[:, :, None, :, :] >> bit) & 1) ^ 1) << 2)
        low = (load_u8(mb4 + (i & 7), m4) >> (4 * (i >> 3))) & 0x0F
        high = (load_u8(mb4 + 8 + (i & 3), m4) >> (2 * (i >> 2))) & 3
        dl = load_f16(mb + 12, mask)[:, :, None, None] * ((low | (high << 4)) - 32).to(tl.float32)
        v = dl[:, :, :, :, None] * q.to(tl.float32)
    kk = tl.arange(0, 2 * NB)[None, :, None, None, None] * 128 + s * 32 + g[:, :, None, :, :] * 16 + l16[:, :, None, :, :]
    return v, kk


@triton.jit
def _q6_k(qb, hb, mb, mask, half, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q6_K halves ``(BN, 2NB)`` -> ``(BN, 2NB, 2, 4, 16)``: value ``64h + 16r + l`` of the half, nibble ``h``
    of low byte ``16r + l``, 2-bit field ``2h + r // 2`` of high byte ``16 (r % 2) + l``; scale ``4h + r``.
    Planes: 128 low bytes, 64 high bytes; meta = 16 int8 scales, d."""
    h = tl.arange(0, 2)[None, None, :, None, None]
    r = tl.arange(0, 4)[None, None, :, None]
    l16 = tl.arange(0, 16)[None, None, None, :]
    m4 = mask[:, :, None, None]
    hf = half[None, :, None, None]
    ql = (load_u8(qb[:, :, None, None] + hf * 64 + r * 16 + l16, m4)[:, :, None, :, :] >> (4 * h)) & 0x0F
    qh = load_u8(hb[:, :, None, None] + hf * 32 + (r % 2) * 16 + l16, m4)[:, :, None, :, :]
    q = (ql | (((qh >> (2 * (2 * h + r[:, :, None, :, :] // 2))) & 3) << 4)) - 32  # (BN, 2NB, 2, 4, 16)
    j = 4 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 4)[None, None, None, :]  # (1, 1, 2, 4)
    sc = signed_byte(load_u8(mb[:, :, None, None] + hf * 8 + j, m4))
    scale = load_f16(mb + 16, mask)[:, :, None, None] * sc.to(tl.float32)
    kk = tl.arange(0, 2 * NB)[None, :, None, None, None] * 128 + h * 64 + r[:, :, None, :, :] * 16 + l16[:, :, None, :, :]
    return scale[:, :, :, :, None] * q.to(tl.float32), kk


@triton.jit
def _iq4_xs(qb, mb, mask, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """IQ4_XS super-blocks ``(BN, NB)`` -> ``(BN, NB, 8, 2, 16)``: value ``32 sb + 16h + l``, nibble ``h`` of
    quant byte ``16 sb + l``; a 6-bit scale per 32-value sub-block ``sb``. Meta: d, scales_h, scales_l[4]."""
    sb3 = tl.arange(0, 8)[None, None, :]
    sb = sb3[:, :, :, None]
    l16 = tl.arange(0, 16)[None, None, None, :]
    h = tl.arange(0, 2)[None, None, None, :, None]
    q = (load_u8(qb[:, :, None, None] + sb * 16 + l16, mask[:, :, None, None])[:, :, :, None, :] >> (4 * h)) & 0x0F
    low = (load_u8(mb[:, :, None] + 4 + sb3 // 2, mask[:, :, None]) >> (4 * (sb3 % 2))) & 0x0F  # (BN, NB, 8)
    high_bits = load_u8(mb + 2, mask) | (load_u8(mb + 3, mask) << 8)  # (BN, NB)
    high = (high_bits[:, :, None] >> (2 * sb3)) & 3
    dl = load_f16(mb, mask)[:, :, None] * ((low | (high << 4)) - 32).to(tl.float32)
    kk = tl.arange(0, NB)[None, :, None, None, None] * 256 + sb[:, :, :, None, :] * 32 + h * 16 + l16[:, :, :, None, :]
    return dl[:, :, :, None, None] * codebook(q, IQ4_LO, IQ4_HI).to(tl.float32), kk


@triton.jit
def block_tile(qs_rows, qh_rows, meta_rows, k0, K, n_mask, TYPE: tl.constexpr, BLOCK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """Values ``k0 .. k0 + BLOCK_K`` of the rows whose planes start at ``qs_rows``, ``qh_rows`` and
    ``meta_rows`` (``(BN,)`` uint8 pointers; ``qh_rows`` unused where the type has no high plane)
    in the type's own axes ``(BN, blocks, ...)``, float32, zero where ``n_mask`` is False or past ``K``;
    and each value's offset from ``k0`` (int32, broadcastable to the values). Flattened row-major, the
    axes after the first are K order. ``k0`` is a multiple of ``BLOCK_K``, ``K`` of the type's block.

    A GEMV multiplies in these axes (the input gathered by the offsets) and reshapes once at the end:
    the values then keep each byte run's lanes in one thread, so scales load once a run."""
    SUPER: tl.constexpr = TYPE == 10 or TYPE == 11 or TYPE == 12 or TYPE == 13 or TYPE == 14 or TYPE == 23
    NB: tl.constexpr = BLOCK_K // 256 if SUPER else BLOCK_K // 32  # blocks a step
    if TYPE == 10 or TYPE == 11 or TYPE == 14:
        qb, hb, mb, mask, half = _halves(qs_rows, qh_rows, meta_rows, k0 // 256, K // 256, n_mask, TYPE, NB)
        if TYPE == 14:
            v, kk = _q6_k(qb, hb, mb, mask, half, NB)
        else:
            v, kk = _q23_k(qb, hb, mb, mask, half, TYPE, NB)
    elif SUPER:
        qb, hb, mb, mask = _blocks(qs_rows, qh_rows, meta_rows, k0 // 256, K // 256, n_mask, TYPE, NB)
        if TYPE == 23:
            v, kk = _iq4_xs(qb, mb, mask, NB)
        else:
            v, kk = _q45_k(qb, hb, mb, mask, TYPE, NB)
    else:
        qb, hb, mb, mask = _blocks(qs_rows, qh_rows, meta_rows, k0 // 32, K // 32, n_mask, TYPE, NB)
        v, kk = _small_block(qb, hb, mb, mask, TYPE, NB)
    return v, kk


@triton.jit
def block_values(qs_rows, qh_rows, meta_rows, k0, K, n_mask, TYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """:func:`block_tile`'s values as ``(BLOCK_N, BLOCK_K)`` in K order (a dequantized tile, e.g. for a dot)."""
    v, _offsets = block_tile(qs_rows, qh_rows, meta_rows, k0, K, n_mask, TYPE, BLOCK_K)
    return tl.reshape(v, (BLOCK_N, BLOCK_K))
