"""One K step of kernels A and B over packed planes: the type's blocks, their scale groups, the dots.

``k_step(acc, ...)`` adds one K step (a 256-value super-block, or ``BLOCKS`` 32-value blocks) of ``BLOCK_N``
weight rows times the rows' activations to ``acc (BN, BM)``, float32, for the type a constexpr; the planes'
byte layout is :data:`~stagewise.spec.packed_types.PLANES` (offsets as in ``packed_blocks_triton``). Each
scale group (32 values; 16 for Q2_K, Q3_K, Q6_K) is ``a * (u - center) + b`` or ``a * codebook[u]``, and
becomes one dot (:mod:`stagewise.kernels.packed_decode_triton`'s module doc has the two modes' arithmetic).
"""

from __future__ import annotations

import triton
import triton.language as tl

from stagewise.kernels.packed_blocks_triton import (
    FP4_HI,
    FP4_LO,
    IQ4_HI,
    IQ4_LO,
    codebook,
    load_f16,
    load_u8,
    load_u32,
    signed_byte,
)
from stagewise.kernels.quant_bf16_triton import (
    FP4_ASM,
    IQ4_ASM,
    Q3K_ASM0,
    Q3K_ASM1,
    Q5K_ASM0,
    Q5K_ASM1,
    Q5K_ASM2,
    Q5K_ASM3,
    codebook_bf16,
    magic,
    nibbles5_bf16,
    nibbles5_word_bf16,
    nibbles_bf16,
    q2_bf16,
    q3_bf16,
    q6_bf16,
)


@triton.jit
def _x_group(a_ptr, rows, row_ok, k, stride_am, GS: tl.constexpr, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """The group's activations ``(GS, BM)`` in the dot's dtype (DOT 0: float32, 1: bf16, 2: f16)."""
    x = tl.load(a_ptr + rows[None, :] * stride_am + (k + tl.arange(0, GS))[:, None], mask=row_ok[None, :], other=0.0)
    if DOT == 0:
        x = x.to(tl.float32)
    return x


@triton.jit
def _mm(w, x, acc, IEEE: tl.constexpr = False):  # type: ignore[no-untyped-def]
    """``w (BN, GS) @ x (GS, BM)`` plus ``acc`` (None: nothing), ``(BN, BM)``; IEEE float32 when ``IEEE``."""
    if IEEE:
        p = tl.dot(w, x, acc, input_precision="ieee")
    else:
        p = tl.dot(w, x, acc)
    return p


@triton.jit
def _dot(w, x, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    return _mm(w, x, None, DOT == 0)


@triton.jit
def _sum_x(x, BN: tl.constexpr, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Every row's ``sum(x)`` over a group ``x (GS, BM)``, ``(BN, BM)`` float32: a dot with a ones tile, on the tensor
    cores."""
    return _dot(tl.full((BN, x.shape[0]), 1.0, x.dtype), x, DOT)


@triton.jit
def _bf(v):  # type: ignore[no-untyped-def]
    """A per-weight-row float32 scale ``(BN,)`` rounded to bf16, shaped ``(BN, 1)`` (kernel B's bf16 arithmetic)."""
    return v.to(tl.bfloat16)[:, None]


@triton.jit
def _linear_group(acc, u, x, a, b, CENTER: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr,
                  SYMMETRIC: tl.constexpr = False):  # type: ignore[no-untyped-def]
    """``acc (BN, BM) += W_g @ x`` for the group's values ``a * (u - CENTER) + b`` (``u`` ``(BN, GS)`` int32;
    ``a``/``b`` ``(BN,)`` float32; ``SYMMETRIC``: ``b`` is zero)."""
    if SCALE_AFTER:
        OFF: tl.constexpr = 1024 if DOT == 2 else 128
        if SYMMETRIC:  # u - CENTER exactly in the dot's dtype: the magic value less OFF + CENTER (small integers)
            p = _dot(magic(u, DOT) - (OFF + CENTER), x, DOT)  # (BN, BM) = sum (u - CENTER) x
            acc += a[:, None] * p
        else:
            p = _dot(magic(u, DOT), x, DOT)  # (BN, BM) = sum (OFF + u) x
            sx = _sum_x(x, u.shape[0], DOT)
            acc += a[:, None] * p
            acc += (b - a * (OFF + CENTER))[:, None] * sx
    else:
        w = a[:, None] * (u - CENTER).to(tl.float32) + b[:, None]
        acc = _mm(w.to(x.dtype), x, acc, DOT == 0)
    return acc


@triton.jit
def _magic_group(acc, w, x, a, b, CENTER: tl.constexpr):  # type: ignore[no-untyped-def]
    """Kernel A's group step from ``w = bf16(128 + u)`` already made (bf16 activations):
    ``acc += a P + (b - a (128 + CENTER)) sum(x)``."""
    p = _mm(w, x, None)
    sx = _sum_x(x, w.shape[0], 1)
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
        acc = _mm(w.to(x.dtype), x, acc, DOT == 0)
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
    if ASM and (TYPE == 2 or TYPE == 3 or TYPE == 6 or TYPE == 7):  # Q4_0/1, Q5_0/1: a byte's two values by inline PTX
        qb = tl.load(q_rows[:, None] + blk * 16 + l16, mask=n_ok[:, None], other=0)
        if TYPE == 6 or TYPE == 7:  # the fifth bit of value j is bit j of the block's 32-bit qh word
            lo_w, hi_w = nibbles5_word_bf16(qb, load_u32(h_rows + blk * 4, n_ok)[:, None] >> l16)
        else:
            lo_w, hi_w = nibbles_bf16(qb)
        d = load_f16(m, n_ok)
        if not SCALE_AFTER:  # kernel B: d * (q - o) (+ m) in bf16 arithmetic, q - o exact
            if TYPE == 2 or TYPE == 6:
                off_b: tl.constexpr = 144.0 if TYPE == 6 else 136.0
                acc = _mm((lo_w - off_b) * _bf(d), x_lo, acc)
                acc = _mm((hi_w - off_b) * _bf(d), x_hi, acc)
            else:
                mn = _bf(load_f16(m + 2, n_ok))
                acc = _mm(tl.fma(lo_w - 128.0, _bf(d), mn), x_lo, acc)
                acc = _mm(tl.fma(hi_w - 128.0, _bf(d), mn), x_hi, acc)
        elif TYPE == 2 or TYPE == 6:  # d * (q - 8), d * (q - 16): 128 + q less 136 or 144, exactly
            off: tl.constexpr = 144.0 if TYPE == 6 else 136.0
            acc += d[:, None] * _mm(lo_w - off, x_lo, _mm(hi_w - off, x_hi, None))
        else:  # d * q + m
            acc += d[:, None] * _mm(lo_w, x_lo, _mm(hi_w, x_hi, None))
            acc += (load_f16(m + 2, n_ok) - 128.0 * d)[:, None] * (_sum_x(x_lo, lo_w.shape[0], 1)
                                                                   + _sum_x(x_hi, lo_w.shape[0], 1))
        return acc
    if ASM and (TYPE == 20 or TYPE == 39):  # IQ4_NL / MXFP4: the codebook values of both nibbles, by inline PTX
        text: tl.constexpr = IQ4_ASM if TYPE == 20 else FP4_ASM
        lo_w, hi_w = codebook_bf16(tl.load(q_rows[:, None] + blk * 16 + l16, mask=n_ok[:, None], other=0), text)
        if TYPE == 20:
            d = load_f16(m, n_ok)
        else:
            e = load_u8(m, n_ok)
            d = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)
        if SCALE_AFTER:
            acc += d[:, None] * _mm(lo_w, x_lo, _mm(hi_w, x_hi, None))
        else:  # kernel B: the entries times d in bf16
            acc = _mm(lo_w * _bf(d), x_lo, acc)
            acc = _mm(hi_w * _bf(d), x_hi, acc)
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
            word = load_u32(h_rows + blk * 4, n_ok)[:, None]
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
def _f16_bits(bits):  # type: ignore[no-untyped-def]
    """The f16 with these bits (the low 16 of an int32), as float32."""
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_meta(m, n_ok):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: a super-block's 16 meta bytes at ``m`` ``(BN,)`` as four int32 words a row (d and dmin, then the
    12 scale bytes), each loaded in the rows' layout: ``(d, dmin, w1, w2, w3)``."""
    w = m.to(tl.pointer_type(tl.int32))
    w0 = tl.load(w, mask=n_ok, other=0)
    return (_f16_bits(w0 & 0xFFFF), _f16_bits((w0 >> 16) & 0xFFFF), tl.load(w + 1, mask=n_ok, other=0),
            tl.load(w + 2, mask=n_ok, other=0), tl.load(w + 3, mask=n_ok, other=0))


@triton.jit
def _k_scale_bytes(w1, w2, w3):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: the scale words (:func:`_k_meta`) -> the 6-bit scales and mins of sub-blocks 0-3 and 4-7, one
    a byte of four int32 words ``(sc_lo, mn_lo, sc_hi, mn_hi)``: bytes of words 1 and 2 (``s < 4``), else the
    nibbles of word 3's bytes and the top bits of words 1 and 2."""
    sc_hi = (w3 & 0x0F0F0F0F) | ((w1 >> 2) & 0x30303030)
    mn_hi = ((w3 >> 4) & 0x0F0F0F0F) | ((w2 >> 2) & 0x30303030)
    return w1 & 0x3F3F3F3F, w2 & 0x3F3F3F3F, sc_hi, mn_hi


@triton.jit
def _k_scale(sc_lo, mn_lo, sc_hi, mn_hi, s: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q4_K / Q5_K: the scale and min of sub-block ``s`` (:func:`_k_scale_bytes`' byte ``s % 4``), float32."""
    sc = ((sc_lo if s < 4 else sc_hi) >> (8 * (s % 4))) & 0xFF
    mn = ((mn_lo if s < 4 else mn_hi) >> (8 * (s % 4))) & 0xFF
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _q2k_scale_min(m, d, dmin, n_ok, GROUP: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q2_K's 16-value group ``GROUP``: its scale ``d sc`` and min term ``-dmin m`` (the meta byte's nibbles), float32."""
    sc = load_u8(m + GROUP, n_ok)
    return d * (sc & 15).to(tl.float32), -(dmin * (sc >> 4).to(tl.float32))


@triton.jit
def _q3k_scale(m, n_ok, GROUP: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q3_K's 16-value group ``GROUP``: its 6-bit scale less 32 (low 4 bits in byte ``GROUP % 8``, high 2 in byte
    ``8 + GROUP % 4``), float32."""
    low = (load_u8(m + (GROUP & 7), n_ok) >> (4 * (GROUP >> 3))) & 15
    high = (load_u8(m + 8 + (GROUP & 3), n_ok) >> (2 * (GROUP >> 2))) & 3
    return ((low | (high << 4)) - 32).to(tl.float32)


@triton.jit
def _super_block(acc, q_rows, h_rows, m_rows, blk, n_ok, a_ptr, rows, row_ok, stride_am,  # type: ignore[no-untyped-def]
                 TYPE: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr):
    """One 256-value super-block (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) at K index ``256 blk``."""
    k0 = blk * 256
    l16 = tl.arange(0, 16)[None, :]
    l32 = tl.arange(0, 32)[None, :]
    if TYPE == 12 or TYPE == 13:  # Q4_K / Q5_K: chunk c's 32 bytes: sub-block 2c (low nibbles), 2c + 1 (high)
        d, dmin, w1, w2, w3 = _k_meta(m_rows + blk * 16, n_ok)
        sc_lo, mn_lo, sc_hi, mn_hi = _k_scale_bytes(w1, w2, w3)
        if TYPE == 13 and not ASM:
            qh = load_u8(h_rows[:, None] + blk * 32 + l32, n_ok[:, None])  # (BN, 32): bit s is sub-block s's fifth bit
        if TYPE == 13 and ASM:
            qh8 = tl.load(h_rows[:, None] + blk * 32 + l32, mask=n_ok[:, None], other=0)  # (BN, 32) uint8
        for c in tl.static_range(4):
            if ASM:  # both nibbles of a byte into bf16 at once, by inline PTX (module doc)
                qb = tl.load(q_rows[:, None] + blk * 128 + 32 * c + l32, mask=n_ok[:, None], other=0)  # (BN, 32) uint8
                if TYPE == 12:
                    lo, hi = nibbles_bf16(qb)
                elif c == 0:
                    lo, hi = nibbles5_bf16(qb, qh8, Q5K_ASM0)
                elif c == 1:
                    lo, hi = nibbles5_bf16(qb, qh8, Q5K_ASM1)
                elif c == 2:
                    lo, hi = nibbles5_bf16(qb, qh8, Q5K_ASM2)
                else:
                    lo, hi = nibbles5_bf16(qb, qh8, Q5K_ASM3)
                for h in tl.static_range(2):
                    sc, mn = _k_scale(sc_lo, mn_lo, sc_hi, mn_hi, 2 * c + h)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 64 * c + 32 * h, stride_am, 32, DOT)
                    if SCALE_AFTER:
                        acc = _magic_group(acc, lo if h == 0 else hi, x, d * sc, -(dmin * mn), 0)
                    else:  # kernel B: u exactly from 128 + u, then one bf16 fma a value
                        w = tl.fma((lo if h == 0 else hi) - 128.0, _bf(d * sc), _bf(-(dmin * mn)))
                        acc = _mm(w, x, acc)
            else:
                q = load_u8(q_rows[:, None] + blk * 128 + 32 * c + l32, n_ok[:, None])  # (BN, 32)
                for h in tl.static_range(2):
                    u = (q >> (4 * h)) & 15
                    if TYPE == 13:
                        u = u | (((qh >> (2 * c + h)) & 1) << 4)
                    sc, mn = _k_scale(sc_lo, mn_lo, sc_hi, mn_hi, 2 * c + h)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 64 * c + 32 * h, stride_am, 32, DOT)
                    acc = _linear_group(acc, u, x, d * sc, -(dmin * mn), 0, SCALE_AFTER, DOT)
    elif TYPE == 14:  # Q6_K: half hf, low bytes 16r + l: values 16r + l (low nibble), 64 + 16r + l (high)
        m = m_rows + blk * 18
        d = load_f16(m + 16, n_ok)
        zero = tl.zeros_like(d)
        t = tl.zeros_like(acc)  # kernel A: sum of sc P over the super-block's groups, times d once after
        for hf in tl.static_range(2):
            for r in tl.static_range(2):  # the low bytes of r and r + 2 share their high bytes 16r + l
                ql = q_rows[:, None] + blk * 128 + 64 * hf + 16 * r + l16  # (BN, 16) pointers; r + 2's 32 further
                qh = h_rows[:, None] + blk * 64 + 32 * hf + 16 * r + l16
                if ASM:  # the four groups' 128 + u in bf16 at once, by inline PTX
                    w0, w1, w2, w3 = q6_bf16(tl.load(ql, mask=n_ok[:, None], other=0),
                                             tl.load(ql + 32, mask=n_ok[:, None], other=0),
                                             tl.load(qh, mask=n_ok[:, None], other=0))
                else:
                    q_lo = load_u8(ql, n_ok[:, None])
                    q_hi = load_u8(ql + 32, n_ok[:, None])
                    q_h = load_u8(qh, n_ok[:, None])
                for j in tl.static_range(4):  # (r, low nibble), (r, high), (r + 2, low), (r + 2, high)
                    h = j % 2  # constexprs (NOTE not annotated: reassigned each unrolled step)
                    rr = r + 2 * (j // 2)
                    sc = signed_byte(load_u8(m + 8 * hf + 4 * h + rr, n_ok)).to(tl.float32)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 128 * hf + 64 * h + 16 * rr, stride_am, 16, DOT)
                    if ASM:  # 128 + u less 160 is u - 32, exactly in bf16
                        w = w0 if j == 0 else w1 if j == 1 else w2 if j == 2 else w3
                        if SCALE_AFTER:
                            t += sc[:, None] * _mm(w - 160.0, x, None)
                        else:  # kernel B: times d * sc in bf16
                            acc = _mm((w - 160.0) * _bf(d * sc), x, acc)
                    else:
                        q = q_lo if j < 2 else q_hi
                        u = ((q >> (4 * h)) & 15) | (((q_h >> (4 * h + 2 * (rr // 2))) & 3) << 4)
                        acc = _linear_group(acc, u, x, d * sc, zero, 32, SCALE_AFTER, DOT, True)
        if ASM and SCALE_AFTER:
            acc += d[:, None] * t
    elif TYPE == 10 and ASM:  # Q2_K, the fields' 128 + u by inline PTX: half hf, byte 16g + l, field s: 32s + 16g + l
        m = m_rows + blk * 20
        d = load_f16(m + 16, n_ok)
        dmin = load_f16(m + 18, n_ok)
        for hf in tl.static_range(2):
            for g in tl.static_range(2):
                w0, w1, w2, w3 = q2_bf16(tl.load(q_rows[:, None] + blk * 64 + 32 * hf + 16 * g + l16,
                                                 mask=n_ok[:, None], other=0))
                for s in tl.static_range(4):
                    a, b = _q2k_scale_min(m, d, dmin, n_ok, 8 * hf + 2 * s + g)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 128 * hf + 32 * s + 16 * g, stride_am, 16, DOT)
                    w = w0 if s == 0 else w1 if s == 1 else w2 if s == 2 else w3
                    if SCALE_AFTER:
                        acc = _magic_group(acc, w, x, a, b, 0)
                    else:  # kernel B: u exactly from 128 + u, then one bf16 fma a value
                        acc = _mm(tl.fma(w - 128.0, _bf(a), _bf(b)), x, acc)
    elif TYPE == 11 and ASM:  # Q3_K, the fields' 128 + u by inline PTX: half hf, byte 16g + l, field s: 32s + 16g + l
        m = m_rows + blk * 14
        d = load_f16(m + 12, n_ok)
        t = tl.zeros_like(acc)  # kernel A: sum of sc P over the super-block's groups, times d once after
        for hf in tl.static_range(2):
            for g in tl.static_range(2):
                qb = tl.load(q_rows[:, None] + blk * 64 + 32 * hf + 16 * g + l16, mask=n_ok[:, None], other=0)
                hb = tl.load(h_rows[:, None] + blk * 32 + 16 * g + l16, mask=n_ok[:, None], other=0)
                if hf == 0:
                    w0, w1, w2, w3 = q3_bf16(qb, hb, Q3K_ASM0)
                else:
                    w0, w1, w2, w3 = q3_bf16(qb, hb, Q3K_ASM1)
                for s in tl.static_range(4):
                    sc = _q3k_scale(m, n_ok, 8 * hf + 2 * s + g)
                    x = _x_group(a_ptr, rows, row_ok, k0 + 128 * hf + 32 * s + 16 * g, stride_am, 16, DOT)
                    w = w0 if s == 0 else w1 if s == 1 else w2 if s == 2 else w3
                    if SCALE_AFTER:  # 128 + u less 132 is u - 4, exactly in bf16
                        t += sc[:, None] * _mm(w - 132.0, x, None)
                    else:  # kernel B: times d * sc in bf16
                        acc = _mm((w - 132.0) * _bf(d * sc), x, acc)
        if SCALE_AFTER:
            acc += d[:, None] * t
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
                        a, b = _q2k_scale_min(m, d, dmin, n_ok, i)
                        acc = _linear_group(acc, u, x, a, b, 0, SCALE_AFTER, DOT)
                    else:  # q = q2 - 4 (1 - high bit) = u - 4 with u = q2 | high << 2
                        u = u | (((hm >> (4 * hf + s)) & 1) << 2)
                        acc = _linear_group(acc, u, x, d * _q3k_scale(m, n_ok, i), zero, 4, SCALE_AFTER, DOT, True)
    else:  # IQ4_XS: sub-block sb's 16 bytes: values 32 sb + l (low nibble), 32 sb + 16 + l (high)
        m = m_rows + blk * 8
        d = load_f16(m, n_ok)
        high_bits = load_u8(m + 2, n_ok) | (load_u8(m + 3, n_ok) << 8)
        for sb in tl.static_range(8):
            low = (load_u8(m + 4 + sb // 2, n_ok) >> (4 * (sb % 2))) & 15
            dl = d * ((low | (((high_bits >> (2 * sb)) & 3) << 4)) - 32).to(tl.float32)
            if ASM:  # the codebook values of both nibbles, by inline PTX
                qb = tl.load(q_rows[:, None] + blk * 128 + 16 * sb + l16, mask=n_ok[:, None], other=0)  # (BN, 16) uint8
                lo_w, hi_w = codebook_bf16(qb, IQ4_ASM)
                x_lo = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb, stride_am, 16, DOT)
                x_hi = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb + 16, stride_am, 16, DOT)
                if SCALE_AFTER:
                    acc += dl[:, None] * _mm(lo_w, x_lo, _mm(hi_w, x_hi, None))
                else:  # kernel B: the entries times dl in bf16
                    acc = _mm(lo_w * _bf(dl), x_lo, acc)
                    acc = _mm(hi_w * _bf(dl), x_hi, acc)
            else:
                q = load_u8(q_rows[:, None] + blk * 128 + 16 * sb + l16, n_ok[:, None])  # (BN, 16)
                for h in tl.static_range(2):
                    x = _x_group(a_ptr, rows, row_ok, k0 + 32 * sb + 16 * h, stride_am, 16, DOT)
                    acc = _codebook_group(acc, codebook((q >> (4 * h)) & 15, IQ4_LO, IQ4_HI), x, dl, SCALE_AFTER, DOT)
    return acc


@triton.jit
def k_step(acc, q_rows, h_rows, m_rows, step, n_ok, a_ptr, rows, row_ok, stride_am,  # type: ignore[no-untyped-def]
           TYPE: tl.constexpr, BLOCKS: tl.constexpr, SCALE_AFTER: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr):
    """``acc (BN, BM) +=`` one K step: a super-block, or ``BLOCKS`` 32-value blocks. With ``ASM`` (bf16 dots), the
    quants of every type go through inline PTX, in both kernels; kernel B then makes each value from the PTX's
    ``128 + u`` by bf16 arithmetic, ``u`` exact and the row's scale and min rounded to bf16 (one ``fma`` or multiply
    a pair of values, no float32 round trip: within about two bf16 roundings of the dequantized value instead of
    one; a codebook entry times its scale). Without PTX, kernel B makes each value in float32 and rounds it to the
    dot's dtype once."""
    if TYPE == 10 or TYPE == 11 or TYPE == 12 or TYPE == 13 or TYPE == 14 or TYPE == 23:
        acc = _super_block(acc, q_rows, h_rows, m_rows, step, n_ok, a_ptr, rows, row_ok, stride_am,
                           TYPE, SCALE_AFTER, DOT, ASM and DOT == 1)
    else:
        for j in tl.static_range(BLOCKS):
            acc = _small_block(acc, q_rows, h_rows, m_rows, step * BLOCKS + j, n_ok, a_ptr, rows, row_ok, stride_am,
                               TYPE, SCALE_AFTER, DOT, ASM and DOT == 1)
    return acc
