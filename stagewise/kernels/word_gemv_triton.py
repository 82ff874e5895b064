"""The word GEMV: Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS matrices times one bf16 input row (single-stream decode).

``y[m] = W @ x[m]`` for a packed ``(N, K)`` matrix held as planes
(:class:`~stagewise.kernels.expert_stacks.PackedStack`), ``K`` a multiple of 2048. The quants are read as
32-bit words and each value costs about two instructions:

* **One conversion.** A word's bytes, each below 128 (a Q4_K nibble; a Q5_K / Q6_K value's nibble, a Q3_K
  value's 2-bit field, with its high bits or'ed in, a whole word at a time), become float32 ``128 + u`` by one
  ``prmt`` each (inline PTX, :data:`BYTES_ASM`: the byte under the exponent bits ``0x43``). The offset comes back
  out once a scale group: ``sum(x (128 + u)) - 128 sum(x)`` (Q6_K's ``u - 32``: ``- 160 sum(x)``; Q3_K's
  ``u - 4``: ``- 132 sum(x)``). IQ4_XS looks ``128 + kv`` up by ``prmt`` byte tables (:data:`CODEBOOK_ASM`, about
  four instructions a value).
* **One FMA** into float32, per value.

A thread owns one quarter of a 256-value super-block (Q4_K / Q5_K: a 64-value chunk, its 8 quant words; IQ4_XS:
two 32-value sub-blocks; Q6_K: values ``l0 .. l0 + 15`` of each of a half's four 32-value groups, 4 low-bit words
of each of two runs and 4 high-bit words; Q3_K: the same values, 4 low-bit words and 4 high-bit words) for each of
a program's ``BLOCK_N`` rows (for ``K`` of 256-1024, a warp takes several
sets of ``BLOCK_N`` rows side by side: :func:`row_threads`), so its inputs are loaded, converted and
summed once for all of them and its scales decoded once a quarter. Every tensor is ``(sets, blocks, 4)`` or
``(sets, blocks, 4, 4)`` with the last dimension in one thread (16-byte loads split by :func:`quarters`): no data
moves between threads until the final sum. Offline SASS for sm_90a (``bench/sass_count.py --modes G``):
3.8 (Q4_K), 4.5 (Q5_K), 3.9 (Q6_K), 4.7 (Q3_K) and 7.1 (IQ4_XS) instructions a value, against 9.2-17.9 for the slot
and byte GEMVs at Llama-3.1-8B's shapes (14-31 at Qwen3.6's expert down, K 512) and 9.0-9.8 for kernel A.

Tile configs are a pure function of the type, ``K`` and the input's dtype (:func:`words_config`), so every
pipeline stage reduces in the same order. Results are float32 sums of products, within float tolerance of
``x @ W.T`` on the dequantized weight (the offset adds a rounding of ``128 sum(x)``-sized terms).
"""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import PackedStack
from stagewise.kernels.gemv_triton import gemv_grid
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import IQ4_HI, IQ4_LO, codebook, k_word_scales
from stagewise.kernels.triton_launch import dependent_launch, launch_device

T = GGMLQuantizationType
WORD_TYPES = frozenset({T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS})
WORDS_ASM = True  # bytes -> float32 by inline PTX (else Triton's ops, the same values: the interpreter's way)
WORDS_BLOCK_N = 4  # rows a program: a thread loads, converts and sums its inputs once for all of them
WORDS_STEPS = ((4096, 2), (2048, 1))  # (BLOCK_K, num_warps) by preference: four threads a super-block

# four bytes (each < 128) -> float32 128 + byte: prmt places byte j under 0x43 (selector 0x7j44)
BYTES_ASM: tl.constexpr = tl.constexpr("\n".join([
    "{", ".reg .b32 m;", "mov.b32 m, 0x43000000;", "prmt.b32 $0, $4, m, 0x7044;", "prmt.b32 $1, $4, m, 0x7144;",
    "prmt.b32 $2, $4, m, 0x7244;", "prmt.b32 $3, $4, m, 0x7344;", "}"]))


def _codebook_tables(values: tuple[int, ...]) -> tuple[int, ...]:
    """The 16 entries ``128 + v`` as bf16 bit patterns in two byte tables of four int32 words each (low bytes, then
    high bytes; entry ``i`` in byte ``i % 4`` of word ``i // 4``): the operands ``$9 .. $16`` of
    :data:`CODEBOOK_ASM`."""
    bits = [struct.unpack("<I", struct.pack("<f", float(v + 128)))[0] >> 16 for v in values]
    assert all(0 < v + 128 <= 256 and struct.unpack("<f", struct.pack("<I", b << 16))[0] == v + 128
               for b, v in zip(bits, values, strict=True))  # exact in bf16, sign bit clear

    def word(entries: list[int]) -> int:
        value = sum(e << (8 * i) for i, e in enumerate(entries))
        return value - (1 << 32) if value >= 1 << 31 else value  # as int32

    lo, hi = [b & 0xFF for b in bits], [b >> 8 for b in bits]
    return tuple(word(t[i:i + 4]) for t in (lo, hi) for i in range(0, 16, 4))


def _codebook_f32_asm() -> str:
    """PTX: a word's 8 nibbles -> float32 ``128 + codebook[n]`` (the low nibbles' in outputs 0-3, the high ones' in
    4-7), the tables in ``$9 .. $16`` (:func:`_codebook_tables`, kept in registers by the caller). Kernel A's
    lookup (the selector ``n0 | n1 << 4 | n2 << 8 | n3 << 12``, two ``prmt`` a table, the half by the index's
    bit 3), then each value's two bytes under a zero half (``prmt`` replicating the high byte's sign, 0: every
    entry is positive)."""
    lines = ["{", ".reg .b32 n, c, s, m, a, b, l, h;"]
    for first, nibble in ((0, "and.b32 n, $8, 0x0f0f0f0f;"), (4, "shr.u32 n, $8, 4; and.b32 n, n, 0x0f0f0f0f;")):
        lines += [nibble, "shr.u32 c, n, 4;", "or.b32 c, c, n;", "prmt.b32 s, c, 0, 0x4420;", "and.b32 s, s, 0x7777;",
                  "shl.b32 m, n, 4;", "prmt.b32 m, m, 0, 0xba98;"]
        for reg, t in (("l", 9), ("h", 13)):
            lines += [f"prmt.b32 a, ${t}, ${t + 1}, s;", f"prmt.b32 b, ${t + 2}, ${t + 3}, s;",
                      f"lop3.b32 {reg}, a, b, m, 0xd8;"]
        lines += [f"prmt.b32 ${first + j}, l, h, 0x{4 + j:x}{j:x}{12 + j:x}{12 + j:x};" for j in range(4)]
    return "\n".join([*lines, "}"])


CODEBOOK_ASM: tl.constexpr = tl.constexpr(_codebook_f32_asm())
IQ4_TABLES = _codebook_tables((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113))  # kvalues
IQ4_T0, IQ4_T1, IQ4_T2, IQ4_T3 = (tl.constexpr(v) for v in IQ4_TABLES[:4])  # low bytes
IQ4_T4, IQ4_T5, IQ4_T6, IQ4_T7 = (tl.constexpr(v) for v in IQ4_TABLES[4:])  # high bytes


@triton.jit
def quarters(t):  # type: ignore[no-untyped-def]
    """``(R, B, 4, 4)`` -> four ``(R, B, 4)`` along the last dimension, which a thread holds whole (no data moves)."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], t.shape[2], 2, 2)))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, b0, a1, b1


@triton.jit
def _bf16_lane(pair, HIGH: tl.constexpr):  # type: ignore[no-untyped-def]
    """The low or high bf16 of int32 ``pair`` as float32 (one instruction)."""
    if HIGH:
        return (pair & -65536).to(tl.float32, bitcast=True)
    else:
        return (pair << 16).to(tl.float32, bitcast=True)


@triton.jit
def _byte(v, J: tl.constexpr):  # type: ignore[no-untyped-def]
    """Byte ``J`` of ``v`` (below 128) as float32 ``128 + byte`` by Triton's ops (the interpreter's BYTES_ASM)."""
    if J >= 2:
        t = (v >> (8 * J - 16)) & 0x00FF0000
    else:
        t = (v << (16 - 8 * J)) & 0x00FF0000
    return (t | 0x43000000).to(tl.float32, bitcast=True)


@triton.jit
def _fma4(acc, a0, a1, a2, a3, p0, p1):  # type: ignore[no-untyped-def]
    """``acc + a0 x0 + a1 x1 + a2 x2 + a3 x3``, the inputs the bf16 pairs ``p0`` (x0, x1) and ``p1`` (x2, x3): one
    FMA a value, chained (never a product summed apart)."""
    acc = acc + a0 * _bf16_lane(p0, False)
    acc = acc + a1 * _bf16_lane(p0, True)
    acc = acc + a2 * _bf16_lane(p1, False)
    return acc + a3 * _bf16_lane(p1, True)


@triton.jit
def _byte_dot(v, p0, p1, acc, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc + sum_j (128 + byte_j(v)) x_j``, the inputs the bf16 pairs ``p0`` (bytes 0, 1) and ``p1`` (2, 3)."""
    if ASM:
        a0, a1, a2, a3 = tl.inline_asm_elementwise(
            asm=BYTES_ASM, constraints="=r,=r,=r,=r,r", args=[v],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        a0, a1, a2, a3 = _byte(v, 0), _byte(v, 1), _byte(v, 2), _byte(v, 3)
    return _fma4(acc, a0, a1, a2, a3, p0, p1)


@triton.jit
def _run_dot(v0, v1, v2, v3, xa, xb, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """16 values (four words of bytes) against their inputs, 8 bf16 pairs (``quarters`` of two loads)."""
    p0, p1, p2, p3 = xa
    q0, q1, q2, q3 = xb
    acc = _byte_dot(v0, p0, p1, tl.zeros_like(_bf16_lane(p0, False)), ASM)
    acc = _byte_dot(v1, p2, p3, acc, ASM)
    acc = _byte_dot(v2, q0, q1, acc, ASM)
    return _byte_dot(v3, q2, q3, acc, ASM)


@triton.jit
def _input_quarters(x32, xo):  # type: ignore[no-untyped-def]
    """The 8 loads of 4 bf16 pairs from ``xo``, ``xo + 4`` .. ``xo + 28`` (64 inputs a thread), each in quarters."""
    return (quarters(tl.load(x32 + xo)), quarters(tl.load(x32 + xo + 4)), quarters(tl.load(x32 + xo + 8)),
            quarters(tl.load(x32 + xo + 12)), quarters(tl.load(x32 + xo + 16)), quarters(tl.load(x32 + xo + 20)),
            quarters(tl.load(x32 + xo + 24)), quarters(tl.load(x32 + xo + 28)))


@triton.jit
def _pairs_sum(xa, xb):  # type: ignore[no-untyped-def]
    """The sum of the 16 inputs in 8 bf16 pairs."""
    p0, p1, p2, p3 = xa
    q0, q1, q2, q3 = xb
    return (_bf16_lane(p0, False) + _bf16_lane(p0, True) + _bf16_lane(p1, False) + _bf16_lane(p1, True)
            + _bf16_lane(p2, False) + _bf16_lane(p2, True) + _bf16_lane(p3, False) + _bf16_lane(p3, True)
            + _bf16_lane(q0, False) + _bf16_lane(q0, True) + _bf16_lane(q1, False) + _bf16_lane(q1, True)
            + _bf16_lane(q2, False) + _bf16_lane(q2, True) + _bf16_lane(q3, False) + _bf16_lane(q3, True))


@triton.jit
def _q4k_scales(m0, m1, m2, m3, c):  # type: ignore[no-untyped-def]
    """A Q4_K super-block's meta words -> chunk ``c``'s sub-blocks ``2c`` and ``2c + 1``: each one's scale and
    the offset ``min + 128 scale`` its ``sum(x)`` takes out."""
    s0, n0, s1, n1 = k_word_scales(m0, m1, m2, m3, c)
    return s0, n0 + 128.0 * s0, s1, n1 + 128.0 * s1


@triton.jit
def _fifth(v, g, UP: tl.constexpr):  # type: ignore[no-untyped-def]
    """Bytes ``v`` with bit ``4 - UP`` of each byte of ``g`` or'ed in as their bit 4 (Q5_K's fifth bit)."""
    return v | ((g << UP) & 0x10101010)


@triton.jit
def _q45k_step(accs, q32, h32, m32, x32, n0, N, bk, rt4, t4, k4, t3, stride_q32, stride_h32, stride_m32,
               TYPE: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q4_K or Q5_K (``TYPE`` 12, 13): thread ``t`` of super-block ``b`` owns chunk ``c = t``
    (values ``64c ..``: sub-block ``2c`` in the low nibbles of its 8 words, ``2c + 1`` in the high; Q5_K's fifth
    bits are bits ``2c``, ``2c + 1`` of the block's 32 high-bit bytes, all 8 words of which it reads). Every
    row's weights first (they never change: the first step reads them before waiting on the kernel that writes
    ``x``), then the inputs, then each row."""
    weights = ()  # Triton's tuples: no unpacking (*) in a kernel
    for r in tl.static_range(BLOCK_N):
        row = tl.minimum(n0 + rt4 * BLOCK_N + r, N - 1).to(tl.int64)  # a row past N reads the last; not stored
        qo = row * stride_q32 + bk * 32 + 8 * t4 + k4  # chunk c's words 0-3, then 4-7
        mo = row * stride_m32 + bk * 4 + k4 + 0 * t4  # the super-block's 16 meta bytes
        if TYPE == 13:
            ho = row * stride_h32 + bk * 8 + k4 + 0 * t4  # its 32 high-bit bytes
            high = (tl.load(h32 + ho), tl.load(h32 + ho + 4))
        else:
            high = ()  # type: ignore[assignment]
        weights = weights + ((tl.load(q32 + qo), tl.load(q32 + qo + 4), tl.load(m32 + mo), high),)  # type: ignore[assignment]  # noqa: RUF005
    wait_for_predecessor(WAIT)
    xo = bk * 128 + 32 * t4 + k4 + 0 * rt4  # bf16 pairs: chunk c's 32 low-nibble inputs from pair 32c, high 32c + 16
    xl0, xl1, xl2, xl3, xh0, xh1, xh2, xh3 = _input_quarters(x32, xo)
    sl = _pairs_sum(xl0, xl1) + _pairs_sum(xl2, xl3)  # once for every row
    sh = _pairs_sum(xh0, xh1) + _pairs_sum(xh2, xh3)
    out = ()
    for r in tl.static_range(BLOCK_N):
        wa, wb, meta, high = weights[r]  # type: ignore[var-annotated]
        w0, w1, w2, w3 = quarters(wa)
        w4, w5, w6, w7 = quarters(wb)
        m0, m1, m2, m3 = quarters(meta)
        s0, k0, s1, k1 = _q4k_scales(m0, m1, m2, m3, t3)
        l0, l1, l2, l3 = w0 & 0x0F0F0F0F, w1 & 0x0F0F0F0F, w2 & 0x0F0F0F0F, w3 & 0x0F0F0F0F
        l4, l5, l6, l7 = w4 & 0x0F0F0F0F, w5 & 0x0F0F0F0F, w6 & 0x0F0F0F0F, w7 & 0x0F0F0F0F
        u0, u1, u2, u3 = (w0 >> 4) & 0x0F0F0F0F, (w1 >> 4) & 0x0F0F0F0F, (w2 >> 4) & 0x0F0F0F0F, (w3 >> 4) & 0x0F0F0F0F
        u4, u5, u6, u7 = (w4 >> 4) & 0x0F0F0F0F, (w5 >> 4) & 0x0F0F0F0F, (w6 >> 4) & 0x0F0F0F0F, (w7 >> 4) & 0x0F0F0F0F
        if TYPE == 13:  # bit 2c of each high byte to bit 4 of the low nibbles' bytes, bit 2c + 1 to the high ones'
            ha, hb = high  # type: ignore[var-annotated]
            g0, g1, g2, g3 = quarters(ha >> (2 * t4))
            g4, g5, g6, g7 = quarters(hb >> (2 * t4))
            l0, l1, l2, l3 = _fifth(l0, g0, 4), _fifth(l1, g1, 4), _fifth(l2, g2, 4), _fifth(l3, g3, 4)
            l4, l5, l6, l7 = _fifth(l4, g4, 4), _fifth(l5, g5, 4), _fifth(l6, g6, 4), _fifth(l7, g7, 4)
            u0, u1, u2, u3 = _fifth(u0, g0, 3), _fifth(u1, g1, 3), _fifth(u2, g2, 3), _fifth(u3, g3, 3)
            u4, u5, u6, u7 = _fifth(u4, g4, 3), _fifth(u5, g5, 3), _fifth(u6, g6, 3), _fifth(u7, g7, 3)
        dl = _run_dot(l0, l1, l2, l3, xl0, xl1, ASM) + _run_dot(l4, l5, l6, l7, xl2, xl3, ASM)
        dh = _run_dot(u0, u1, u2, u3, xh0, xh1, ASM) + _run_dot(u4, u5, u6, u7, xh2, xh3, ASM)
        out = out + (accs[r] + (s0 * dl - k0 * sl + s1 * dh - k1 * sh),)  # type: ignore[assignment]  # noqa: RUF005
    return out


@triton.jit
def _q6k_bytes(a, h, S: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q6_K's 6-bit values of group ``S`` (0-3) from a low-bit word ``a`` (groups 0, 2: the first run's low and
    high nibbles; 1, 3: the second run's) and its high-bit word ``h`` (bits ``2S``, ``2S + 1`` of each byte)."""
    if S == 0:
        return (a & 0x0F0F0F0F) | ((h << 4) & 0x30303030)
    elif S == 1:
        return (a & 0x0F0F0F0F) | ((h << 2) & 0x30303030)
    elif S == 2:
        return ((a >> 4) & 0x0F0F0F0F) | (h & 0x30303030)
    else:
        return ((a >> 4) & 0x0F0F0F0F) | ((h >> 2) & 0x30303030)


@triton.jit
def _half_inputs(x32, bk, rt4, t4, k4, OFFSET: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q6_K's and Q3_K's thread inputs: values ``128 h + 32 s + l0 ..`` (``h = t // 2``, ``l0 = 16 (t % 2)``) of
    each of a half's four groups ``s``, as ``(xa, xb, OFFSET sum(x))`` (two loads' quarters, the offset the group's
    ``128 + u`` takes out)."""
    xo = bk * 128 + 64 * (t4 // 2) + 8 * (t4 % 2) + k4 + 0 * rt4  # bf16 pairs of values 128 h + 32 s + l0 ..
    inputs = ()
    for s in tl.static_range(4):
        xa, xb = quarters(tl.load(x32 + xo + 16 * s)), quarters(tl.load(x32 + xo + 16 * s + 4))
        inputs = inputs + ((xa, xb, OFFSET * _pairs_sum(xa, xb)),)  # type: ignore[assignment]  # noqa: RUF005
    return inputs


@triton.jit
def _q6k_step(accs, q32, h32, meta_ptr, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_h32, stride_m,
              BLOCK_N: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q6_K (210-byte blocks: ql[128] | qh[64] | scales[16], d): thread ``t`` of super-block ``b``
    owns half ``t // 2`` (128 values) at ``l0 = 16 (t % 2)``: values ``l0 .. l0 + 15`` of each of the half's
    four 32-value groups, one scale each (``scales[8 (t // 2) + 2 s + t % 2]``). Weights first, as for Q4_K."""
    weights = ()
    for r in tl.static_range(BLOCK_N):
        row = tl.minimum(n0 + rt4 * BLOCK_N + r, N - 1).to(tl.int64)
        row3 = tl.minimum(n0 + rt3 * BLOCK_N + r, N - 1).to(tl.int64)
        qo = row * stride_q32 + bk * 32 + 16 * (t4 // 2) + 4 * (t4 % 2) + k4  # ql runs: ql[64 h + l0 ..], + 32
        ho = row * stride_h32 + bk * 16 + 8 * (t4 // 2) + 4 * (t4 % 2) + k4  # qh[32 h + l0 ..]
        block = meta_ptr + row3 * stride_m + b3 * 18
        d = tl.load((block + 16).to(tl.pointer_type(tl.float16)) + 0 * t3).to(tl.float32)
        sc = (block + 8 * (t3 // 2) + (t3 % 2)).to(tl.pointer_type(tl.int8))  # groups s = 0 .. 3 two bytes apart
        scales = (d * tl.load(sc).to(tl.float32), d * tl.load(sc + 2).to(tl.float32),
                  d * tl.load(sc + 4).to(tl.float32), d * tl.load(sc + 6).to(tl.float32))
        weights = weights + ((tl.load(q32 + qo), tl.load(q32 + qo + 8), tl.load(h32 + ho), scales),)  # type: ignore[assignment]  # noqa: RUF005
    wait_for_predecessor(WAIT)
    inputs = _half_inputs(x32, bk, rt4, t4, k4, 160.0)  # u - 32 = (128 + u) - 160
    out = ()
    for r in tl.static_range(BLOCK_N):
        wa, wb, wh, scales = weights[r]  # type: ignore[var-annotated]
        a0, a1, a2, a3 = quarters(wa)
        b0, b1, b2_, b3 = quarters(wb)
        h0, h1, h2, h3 = quarters(wh)
        acc = accs[r]
        for s in tl.static_range(4):
            xa, xb, offset = inputs[s]  # type: ignore[var-annotated]
            if s % 2 == 0:
                g = _run_dot(_q6k_bytes(a0, h0, s), _q6k_bytes(a1, h1, s), _q6k_bytes(a2, h2, s),
                             _q6k_bytes(a3, h3, s), xa, xb, ASM)
            else:
                g = _run_dot(_q6k_bytes(b0, h0, s), _q6k_bytes(b1, h1, s), _q6k_bytes(b2_, h2, s),
                             _q6k_bytes(b3, h3, s), xa, xb, ASM)
            acc = acc + scales[s] * (g - offset)  # u - 32 = (128 + u) - 160
        out = out + (acc,)  # type: ignore[assignment]  # noqa: RUF005
    return out


@triton.jit
def _q3k_bytes(a, h, S: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q3_K's 3-bit values ``u`` of field ``S`` (0-3) of a low-bit word ``a`` (four 2-bit fields a byte), each with
    its high bit from ``h`` (the high-bit word shifted by the half: bit ``S`` of each byte), every byte below 8."""
    if S == 3:
        return ((a >> 6) & 0x03030303) | ((h >> 1) & 0x04040404)
    else:
        return ((a >> (2 * S)) & 0x03030303) | ((h << (2 - S)) & 0x04040404)


@triton.jit
def _q3k_step(accs, q32, h32, meta_ptr, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_h32, stride_m,
              BLOCK_N: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q3_K (110-byte blocks: hmask[32] | qs[64] | scales[12], d; value ``128 h + 32 s + 16 g + l`` in
    field ``s`` of qs byte ``32 h + 16 g + l``, its high bit bit ``4 h + s`` of hmask byte ``16 g + l``, its 6-bit
    scale ``8 h + 2 s + g``): thread ``t`` of super-block ``b`` owns half ``h = t // 2`` at ``g = t % 2``, the Q6_K
    thread's values (16 of each of the half's four 32-value groups, one scale each). Weights first, as for Q4_K."""
    weights = ()
    for r in tl.static_range(BLOCK_N):
        row = tl.minimum(n0 + rt4 * BLOCK_N + r, N - 1).to(tl.int64)
        row3 = tl.minimum(n0 + rt3 * BLOCK_N + r, N - 1).to(tl.int64)
        qo = row * stride_q32 + bk * 16 + 8 * (t4 // 2) + 4 * (t4 % 2) + k4  # qs[32 h + 16 g ..]
        ho = row * stride_h32 + bk * 8 + 4 * (t4 % 2) + k4  # hmask[16 g ..]
        block = meta_ptr + row3 * stride_m + b3 * 14
        d = tl.load((block + 12).to(tl.pointer_type(tl.float16)) + 0 * t3).to(tl.float32)
        half, g = t3 // 2, t3 % 2
        scales = ()
        for s in tl.static_range(4):  # scale 8 h + 2 s + g: low 4 bits in byte 2 s + g (nibble h), high 2 in 8 + ...
            low = (tl.load(block + 2 * s + g) >> (4 * half)) & 15
            high = (tl.load(block + 8 + ((2 * s + g) & 3)) >> (4 * half + 2 * (s // 2))) & 3
            scales = scales + (d * ((low | (high << 4)).to(tl.int32) - 32).to(tl.float32),)  # type: ignore[assignment]  # noqa: RUF005
        weights = weights + ((tl.load(q32 + qo), tl.load(h32 + ho), scales),)  # type: ignore[assignment]  # noqa: RUF005
    wait_for_predecessor(WAIT)
    inputs = _half_inputs(x32, bk, rt4, t4, k4, 132.0)  # u - 4 = (128 + u) - 132
    out = ()
    for r in tl.static_range(BLOCK_N):
        wa, wh, scales = weights[r]  # type: ignore[var-annotated]
        a0, a1, a2, a3 = quarters(wa)
        h0, h1, h2, h3 = quarters(wh)
        shift = 4 * (t3 // 2)  # the half's high bits: 0-3 or 4-7 of each byte
        h0, h1, h2, h3 = h0 >> shift, h1 >> shift, h2 >> shift, h3 >> shift
        acc = accs[r]
        for s in tl.static_range(4):
            xa, xb, offset = inputs[s]  # type: ignore[var-annotated]
            g = _run_dot(_q3k_bytes(a0, h0, s), _q3k_bytes(a1, h1, s), _q3k_bytes(a2, h2, s),
                         _q3k_bytes(a3, h3, s), xa, xb, ASM)
            acc = acc + scales[s] * (g - offset)  # u - 4 = (128 + u) - 132
        out = out + (acc,)  # type: ignore[assignment]  # noqa: RUF005
    return out


@triton.jit
def _half_step(accs, q32, h32, meta_ptr, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_h32, stride_m,
               TYPE: tl.constexpr, BLOCK_N: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q6_K (``TYPE`` 14) or Q3_K (11), whose threads own the same values (:func:`_half_inputs`)."""
    if TYPE == 14:
        out = _q6k_step(accs, q32, h32, meta_ptr, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_h32,
                        stride_m, BLOCK_N, ASM, WAIT)
    else:
        out = _q3k_step(accs, q32, h32, meta_ptr, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_h32,
                        stride_m, BLOCK_N, ASM, WAIT)
    return out


@triton.jit
def _iq4_entry(w, SHIFT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``128 + kv[n]`` as float32 for the nibble at bits ``SHIFT``.. of ``w`` (Triton's ops: the interpreter's)."""
    return (codebook((w >> SHIFT) & 15, IQ4_LO, IQ4_HI) + 128).to(tl.float32)


@triton.jit
def _iq4_dot(w, p0, p1, q0, q1, acc, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc + sum (128 + kv[n]) x`` over word ``w``'s 8 nibbles: the low ones' inputs the bf16 pairs ``p0``,
    ``p1``, the high ones' ``q0``, ``q1`` (IQ4_XS: a sub-block's values ``j`` and ``16 + j``)."""
    if ASM:
        t0, t1, t2, t3 = (tl.full(w.shape, IQ4_T0, tl.int32), tl.full(w.shape, IQ4_T1, tl.int32),
                          tl.full(w.shape, IQ4_T2, tl.int32), tl.full(w.shape, IQ4_T3, tl.int32))
        t4, t5, t6, t7 = (tl.full(w.shape, IQ4_T4, tl.int32), tl.full(w.shape, IQ4_T5, tl.int32),
                          tl.full(w.shape, IQ4_T6, tl.int32), tl.full(w.shape, IQ4_T7, tl.int32))
        a0, a1, a2, a3, b0, b1, b2, b3 = tl.inline_asm_elementwise(
            asm=CODEBOOK_ASM, constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r",
            args=[w, t0, t1, t2, t3, t4, t5, t6, t7],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1)
    else:
        a0, a1, a2, a3 = _iq4_entry(w, 0), _iq4_entry(w, 8), _iq4_entry(w, 16), _iq4_entry(w, 24)
        b0, b1, b2, b3 = _iq4_entry(w, 4), _iq4_entry(w, 12), _iq4_entry(w, 20), _iq4_entry(w, 28)
    return _fma4(_fma4(acc, a0, a1, a2, a3, p0, p1), b0, b1, b2, b3, q0, q1)


@triton.jit
def _iq4_run(w0, w1, w2, w3, xl0, xl1, xh0, xh1, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """An IQ4_XS sub-block (four words) against its inputs: the low nibbles' in ``xl0``, ``xl1``, the high ones' in
    ``xh0``, ``xh1`` (the quarters of two loads each)."""
    p0, p1, p2, p3 = xl0
    q0, q1, q2, q3 = xh0
    acc = _iq4_dot(w0, p0, p1, q0, q1, tl.zeros_like(_bf16_lane(p0, False)), ASM)
    acc = _iq4_dot(w1, p2, p3, q2, q3, acc, ASM)
    p0, p1, p2, p3 = xl1
    q0, q1, q2, q3 = xh1
    acc = _iq4_dot(w2, p0, p1, q0, q1, acc, ASM)
    return _iq4_dot(w3, p2, p3, q2, q3, acc, ASM)


@triton.jit
def _iq4xs_scales(m0, m1, t3, U: tl.constexpr):  # type: ignore[no-untyped-def]
    """IQ4_XS sub-block ``2t + U``'s scale ``d (ls - 32)`` from the block's meta words (d and scales_h; scales_l)."""
    d = ((m0 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    low = (m1 >> (8 * t3 + 4 * U)) & 0xF
    high = (m0 >> (16 + 4 * t3 + 2 * U)) & 3
    return d * ((low | (high << 4)) - 32).to(tl.float32)


@triton.jit
def _iq4xs_step(accs, q32, m32, x32, n0, N, bk, b3, rt4, rt3, t4, k4, t3, stride_q32, stride_m32,
                BLOCK_N: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of IQ4_XS (136-byte blocks: d, scales_h, scales_l[4] | qs[128]; eight 32-value sub-blocks of 16
    bytes, value ``j`` in the low nibble of byte ``j``, ``16 + j`` in its high one): thread ``t`` of super-block
    ``b`` owns sub-blocks ``2t`` and ``2t + 1`` (words ``8t ..``). Weights first, as for Q4_K."""
    weights = ()
    for r in tl.static_range(BLOCK_N):
        row = tl.minimum(n0 + rt4 * BLOCK_N + r, N - 1).to(tl.int64)
        row3 = tl.minimum(n0 + rt3 * BLOCK_N + r, N - 1).to(tl.int64)
        qo = row * stride_q32 + bk * 32 + 8 * t4 + k4  # sub-block 2t's 4 words, then 2t + 1's
        mo = row3 * stride_m32 + b3 * 2 + 0 * t3  # the block's 8 meta bytes as two words
        weights = weights + ((tl.load(q32 + qo), tl.load(q32 + qo + 4), tl.load(m32 + mo), tl.load(m32 + mo + 1)),)  # type: ignore[assignment]  # noqa: RUF005
    wait_for_predecessor(WAIT)
    xo = bk * 128 + 32 * t4 + k4 + 0 * rt4  # bf16 pairs: sub-block 2t from pair 32t (its values 16 .. from + 8)
    al0, al1, ah0, ah1, bl0, bl1, bh0, bh1 = _input_quarters(x32, xo)
    sa = 128.0 * (_pairs_sum(al0, al1) + _pairs_sum(ah0, ah1))  # once for every row
    sb = 128.0 * (_pairs_sum(bl0, bl1) + _pairs_sum(bh0, bh1))
    out = ()
    for r in tl.static_range(BLOCK_N):
        wa, wb, m0, m1 = weights[r]  # type: ignore[var-annotated]
        w0, w1, w2, w3 = quarters(wa)
        w4, w5, w6, w7 = quarters(wb)
        da = _iq4_run(w0, w1, w2, w3, al0, al1, ah0, ah1, ASM)
        db = _iq4_run(w4, w5, w6, w7, bl0, bl1, bh0, bh1, ASM)
        part = _iq4xs_scales(m0, m1, t3, 0) * (da - sa) + _iq4xs_scales(m0, m1, t3, 1) * (db - sb)
        out = out + (accs[r] + part,)  # type: ignore[assignment]  # noqa: RUF005
    return out


@triton.jit
def _words_kernel(x_ptr, qs_ptr, qh_ptr, meta_ptr, y_ptr, e_ptr, N, K, stride_xm, stride_qe, stride_qn, stride_he,
                  stride_hn, stride_me, stride_mn, stride_ym, x_repeat, TYPE: tl.constexpr, GATHER: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_THREADS: tl.constexpr, ASM: tl.constexpr,
                  GDC: tl.constexpr):
    """``ROW_THREADS x BLOCK_N`` output rows of output row ``m``'s matrix (expert ``e_ptr[m]`` of a stack where
    ``GATHER``) and input row ``m // x_repeat``, ``K % BLOCK_K == 0``: four threads a super-block of ``BLOCK_K``
    for each of ``ROW_THREADS`` sets of ``BLOCK_N`` rows (more than one set where ``K`` is short), module note."""
    NB: tl.constexpr = BLOCK_K // 256
    tiles = tl.cdiv(N, BLOCK_N * ROW_THREADS)
    rows = tl.num_programs(0) // tiles
    pid = tl.program_id(0)
    m = pid % rows
    n0 = (pid // rows) * BLOCK_N * ROW_THREADS
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
        e = tl.load(e_ptr + m).to(tl.int64)
        qs_ptr += e * stride_qe
        qh_ptr += e * stride_he
        meta_ptr += e * stride_me
    WAIT: tl.constexpr = GDC and not GATHER  # a plain GEMV reads its first weights while the previous kernel ends
    q32 = qs_ptr.to(tl.pointer_type(tl.int32))
    h32 = qh_ptr.to(tl.pointer_type(tl.int32))
    x32 = (x_ptr + (m // x_repeat) * stride_xm).to(tl.pointer_type(tl.int32))
    rt4 = tl.arange(0, ROW_THREADS)[:, None, None, None]  # (R, B, 4 threads, 4 words): the words' tiles
    b4 = tl.arange(0, NB)[None, :, None, None]
    t4 = tl.arange(0, 4)[None, None, :, None]
    k4 = tl.arange(0, 4)[None, None, None, :]
    rt3 = tl.arange(0, ROW_THREADS)[:, None, None]  # (R, B, 4 threads): what a thread holds one of
    b3 = tl.arange(0, NB)[None, :, None]
    t3 = tl.arange(0, 4)[None, None, :]
    accs = ()
    for _r in tl.static_range(BLOCK_N):
        accs = accs + (tl.zeros((ROW_THREADS, NB, 4), tl.float32),)  # type: ignore[assignment]  # noqa: RUF005
    if TYPE == 14 or TYPE == 11:  # Q6_K, Q3_K: a half's four groups a thread, the meta read as bytes
        accs = _half_step(accs, q32, h32, meta_ptr, x32, n0, N, b4, b3, rt4, rt3, t4, k4, t3, stride_qn // 4,
                          stride_hn // 4, stride_mn, TYPE, BLOCK_N, ASM, WAIT)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            accs = _half_step(accs, q32, h32, meta_ptr, x32, n0, N, k0 // 256 + b4, k0 // 256 + b3, rt4, rt3, t4, k4,
                              t3, stride_qn // 4, stride_hn // 4, stride_mn, TYPE, BLOCK_N, ASM, False)
    elif TYPE == 23:  # IQ4_XS
        m32 = meta_ptr.to(tl.pointer_type(tl.int32))
        accs = _iq4xs_step(accs, q32, m32, x32, n0, N, b4, b3, rt4, rt3, t4, k4, t3, stride_qn // 4, stride_mn // 4,
                           BLOCK_N, ASM, WAIT)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            accs = _iq4xs_step(accs, q32, m32, x32, n0, N, k0 // 256 + b4, k0 // 256 + b3, rt4, rt3, t4, k4, t3,
                               stride_qn // 4, stride_mn // 4, BLOCK_N, ASM, False)
    else:  # Q4_K, Q5_K
        m32 = meta_ptr.to(tl.pointer_type(tl.int32))
        accs = _q45k_step(accs, q32, h32, m32, x32, n0, N, b4, rt4, t4, k4, t3, stride_qn // 4, stride_hn // 4,
                          stride_mn // 4, TYPE, BLOCK_N, ASM, WAIT)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            accs = _q45k_step(accs, q32, h32, m32, x32, n0, N, k0 // 256 + b4, rt4, t4, k4, t3, stride_qn // 4,
                              stride_hn // 4, stride_mn // 4, TYPE, BLOCK_N, ASM, False)
    rows_out = n0 + tl.arange(0, ROW_THREADS) * BLOCK_N
    for r in tl.static_range(BLOCK_N):
        y = tl.sum(tl.sum(accs[r], axis=2), axis=1)  # (R,)
        tl.store(y_ptr + m * stride_ym + rows_out + r, y.to(y_ptr.dtype.element_ty), mask=rows_out + r < N)


def int32_rows(plane: torch.Tensor, start_align: int) -> bool:
    """Whether ``plane``'s rows can be read as 32-bit words: every stride and the row a multiple of 4 bytes, the
    start of ``start_align`` (4 for the word GEMV, whose launch vectorizes where it can; 16 for the slot GEMV)."""
    return (all(st % 4 == 0 for st in plane.stride()[:-1]) and plane.shape[-1] % 4 == 0
            and plane.data_ptr() % start_align == 0)


def words_config(ggml_type: GGMLQuantizationType, k: int, gather: bool,
                 x_dtype: torch.dtype) -> tuple[int, int, int] | None:
    """``(BLOCK_N, BLOCK_K, num_warps)`` of the word GEMV, or None where it does not apply: :data:`WORD_TYPES`,
    bf16 input, ``K`` a multiple of 2048, or 256, 512 or 1024 (one step, several sets of rows a warp: see
    :func:`row_threads`). A pure function of its arguments (``gather``, routed experts of a stack, takes the same
    tiles), so every stage takes the same path and reduces alike."""
    if ggml_type not in WORD_TYPES or x_dtype != torch.bfloat16:
        return None
    for block_k, warps in WORDS_STEPS:
        if k % block_k == 0:
            return WORDS_BLOCK_N, block_k, warps
    if k in (256, 512, 1024):
        return WORDS_BLOCK_N, k, 1
    return None


def row_threads(block_k: int) -> int:
    """Sets of ``BLOCK_N`` rows a program takes side by side: a warp's 32 threads at four a super-block."""
    return max(1, 2048 // block_k)


def words_gemv(x2: torch.Tensor, weight: PackedStack, y: torch.Tensor, config: tuple[int, int, int],
               expert_index: torch.Tensor | None = None, x_repeat: int = 1) -> None:
    """``y[m] = W[e_m] @ x2[m // x_repeat]`` for bf16 ``x2 (M / x_repeat, K)`` and the planes of one ``(N, K)``
    matrix of :data:`WORD_TYPES` or a stack ``(E, N, K)`` with ``expert_index`` (int32, ``M``), by
    :func:`_words_kernel` with ``config`` (:func:`words_config`'s or a benchmark's)."""
    qs, qh, meta = weight.qs, weight.qh, weight.meta
    block_n, block_k, warps = config
    n, k, gather = qs.shape[-2], x2.shape[1], qs.dim() == 3
    if (weight.ggml_type not in WORD_TYPES or x2.dtype != torch.bfloat16 or k % block_k
            or gather != (expert_index is not None)):
        raise ValueError(f"the word GEMV takes Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS, bf16 input, K a multiple of {block_k}, an "
                         "expert index exactly for a stack")
    planes = {T.Q3_K: (qs, qh), T.Q4_K: (qs, meta), T.Q5_K: (qs, qh, meta), T.Q6_K: (qs, qh),
              T.IQ4_XS: (qs, meta)}[weight.ggml_type]
    if not all(int32_rows(p, 4) for p in planes):  # the path is a function of type and shape: never switch on an address
        raise ValueError(f"{weight.ggml_type.name} planes must start 4-byte aligned with strides a multiple of 4 bytes")
    if x2.data_ptr() % 4 or x2.stride(0) % 2:  # read as bf16 pairs: a view at an odd element is copied (same values)
        x2 = x2.clone(memory_format=torch.contiguous_format)
    qh_arg = qh if qh.shape[-1] else qs  # Q4_K: no high plane, any pointer (never read)

    def strides(p: torch.Tensor) -> tuple[int, int]:
        return (p.stride(0) if gather else 0), p.stride(-2)

    sets = row_threads(block_k)
    with launch_device(x2):
        _words_kernel[gemv_grid(n, block_n * sets, y.shape[0])](
            x2, qs, qh_arg, meta, y, y if expert_index is None else expert_index, n, k, x2.stride(0), *strides(qs),
            *strides(qh_arg), *strides(meta), y.stride(0), x_repeat, TYPE=int(weight.ggml_type), GATHER=gather,
            BLOCK_N=block_n, BLOCK_K=block_k, ROW_THREADS=sets, ASM=WORDS_ASM and x2.is_cuda, num_warps=warps,
            num_stages=1, **dependent_launch(x2),
        )
