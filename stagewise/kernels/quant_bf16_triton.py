"""Packed quants to bf16 exactly, in Triton: the magic-number values of kernel A and its inline PTX.

Kernel A (:mod:`stagewise.kernels.packed_decode_triton`) dots ``128 + u`` instead of the quant ``u``
(``0 <= u < 128``): the bf16 with bits ``0x4300 | u`` is exactly that value (f16: ``0x6400 | u`` is ``1024 + u``),
and the group's scale takes the 128 back out after the dot. :func:`magic` makes it from int32 quants with
Triton's per-value ops (any dtype; float32 ``u + 128`` in Triton's interpreter). For the 4-bit types the
bytes go through inline PTX instead, each output a register of two bf16: :func:`nibbles_bf16` and
:func:`nibbles5_bf16` take two bytes at a time (``pack=2``: the pair a thread holds of the dot's operand layout,
one 16-bit shared-memory load, used as loaded; four at a time, the word mixes two rows' pairs, which Triton
repacks byte by byte, about one more instruction a value): ``prmt`` spreads the two bytes into 16-bit lanes and
``lop3`` masks a nibble and ors the magic bits, one instruction a value (Q5_K's fifth bit moved in from its
high-bit byte); :func:`q6_bf16` likewise makes Q6_K's ``128 + u`` of four 16-value groups from two rows' low-byte
pairs and the high-byte pair they share, and :func:`q3_bf16` Q3_K's ``128 + u`` of a byte pair's four 2-bit fields with their
high bits (kernel A 10.03 -> 7.51 SASS instructions a value, kernel B 10.91 -> 7.16 at 16 rows), :func:`q2_bf16`
Q2_K's fields alone. :func:`codebook_bf16`
(IQ4_NL / IQ4_XS / MXFP4, two bytes at a time, as loaded) looks the entries' bf16 bytes up in ``prmt`` byte tables.
The interpreter does not run PTX: ``tests/test_packed_decode.py`` runs these instruction by instruction, and the GPU
tests run them compiled.
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl


def _fifth_bit_asm(setup: list[str], fifth_lo: list[str], fifth_hi: list[str]) -> str:
    """PTX of two bytes ``$2`` -> ``128 + u`` of their low nibbles (``$0``) and high nibbles (``$1``) as bf16 pairs, as
    :data:`NIBBLES_ASM`, each lane's fifth bit at bit 4 of register ``a``, which ``fifth_lo`` / ``fifth_hi`` make
    (after ``setup``)."""
    return "\n".join(["{", ".reg .b32 t, h, a, m;", "cvt.u32.u16 t, $2;", *setup, "prmt.b32 t, t, 0, 0x4140;",
                      "lop3.b32 m, t, 0x000f000f, 0x43004300, 0xea;", *fifth_lo,
                      "lop3.b32 $0, a, 0x00100010, m, 0xea;", "shr.u32 t, t, 4;",
                      "lop3.b32 m, t, 0x000f000f, 0x43004300, 0xea;", *fifth_hi,
                      "lop3.b32 $1, a, 0x00100010, m, 0xea;", "}"])


def _nibbles5_asm(bit: int) -> str:
    """PTX for :func:`nibbles5_bf16`: each value's fifth bit from bit ``bit`` (low nibbles) and ``bit + 1`` (high
    nibbles) of the matching high-bit byte ``$3``, moved to bit 4 of its 16-bit lane."""
    def move(b: int) -> str:
        return f"shl.b32 a, h, {4 - b};" if b <= 4 else f"shr.u32 a, h, {b - 4};"

    return _fifth_bit_asm(["cvt.u32.u16 h, $3;", "prmt.b32 h, h, 0, 0x4140;"], [move(bit)], [move(bit + 1)])


def _codebook_asm(values: tuple[int, ...]) -> str:
    """PTX for :func:`codebook_bf16`: the 16 entries' bf16 bit patterns as two byte tables (low and high bytes,
    eight entries a ``prmt`` pair). Two bytes' four nibbles are already a ``prmt`` selector: with bit 3 cleared
    (it would replicate a sign), one lookup a table half, the half per byte by bit 3 moved to bit 2 of a
    ``0x3210`` selector, and the low and high bytes interleaved into bf16 pairs."""
    bits = [struct.unpack("<I", struct.pack("<f", float(v)))[0] >> 16 for v in values]  # exact: small integers
    assert all(float(struct.unpack("<f", struct.pack("<I", b << 16))[0]) == v for b, v in zip(bits, values, strict=True))

    def word(entries: list[int]) -> str:
        return f"0x{sum(e << (8 * i) for i, e in enumerate(entries)):08x}"

    lines = ["{", ".reg .b32 t, s, c, a, b, l, h, t0, t1, t2, t3;", "cvt.u32.u16 t, $2;", "and.b32 s, t, 0x7777;",
             "shr.u32 c, t, 1;", "lop3.b32 c, c, 0x4444, 0x3210, 0xea;"]
    for reg, table in (("l", [b & 0xFF for b in bits]), ("h", [b >> 8 for b in bits])):
        lines += [f"mov.b32 t0, {word(table[0:4])};", f"mov.b32 t1, {word(table[4:8])};",
                  f"mov.b32 t2, {word(table[8:12])};", f"mov.b32 t3, {word(table[12:16])};",
                  "prmt.b32 a, t0, t1, s;", "prmt.b32 b, t2, t3, s;", f"prmt.b32 {reg}, a, b, c;"]
    return "\n".join([*lines, "prmt.b32 $0, l, h, 0x6240;", "prmt.b32 $1, l, h, 0x7351;", "}"])


IQ4_ASM: tl.constexpr = tl.constexpr(_codebook_asm((-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                                                    113)))  # gguf IQ4_NL.kvalues
FP4_ASM: tl.constexpr = tl.constexpr(_codebook_asm((0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)))  # MXFP4
NIBBLES_ASM: tl.constexpr = tl.constexpr("\n".join([  # two bytes (16 bits) -> their low and their high nibbles
    "{", ".reg .b32 t;", "cvt.u32.u16 t, $2;", "prmt.b32 t, t, 0, 0x4140;",
    "lop3.b32 $0, t, 0x000f000f, 0x43004300, 0xea;", "shr.u32 t, t, 4;",
    "lop3.b32 $1, t, 0x000f000f, 0x43004300, 0xea;", "}"]))
# Q5_0 / Q5_1: two bytes (elements l, l + 1 of a block) and each element's qh word shifted right by its l (bit 0: its
# low nibble's fifth bit, bit 16: its high nibble's) -> 128 + u of the low and of the high nibbles.
Q5_ASM: tl.constexpr = tl.constexpr(_fifth_bit_asm(
    [], ["prmt.b32 a, $3, $4, 0x5410;", "shl.b32 a, a, 4;"], ["prmt.b32 a, $3, $4, 0x7632;", "shl.b32 a, a, 4;"]))
# Q6_K: low bytes of rows r and r + 2 of a half (r < 2) and their shared high bytes -> 128 + u of (r, low nibble),
# (r, high), (r + 2, low), (r + 2, high): fields 0, 2, 1 and 3 of the high byte (bits 2f, 2f + 1) moved to bits 4
# and 5. The high byte is spread with the magic bytes beside it, so (r, high), whose field is already in place,
# is one select: bits 0-3 and 6-7 from the nibble, the rest (field and magic) from the high byte. The magic word is
# prmt's first source (a register ptxas holds): as the second, it took SASS PRMT's immediate slot and the selector a
# register copied in at every use (kernel A 6.67 -> 6.55 SASS instructions a Q6_K value, bench/sass_count.py).
Q6K_ASM: tl.constexpr = tl.constexpr("\n".join([
    "{", ".reg .b32 t, u, e, a, m;", "cvt.u32.u16 t, $4;", "cvt.u32.u16 u, $5;", "cvt.u32.u16 e, $6;",
    "prmt.b32 t, t, 0, 0x4140;", "prmt.b32 u, u, 0, 0x4140;", "mov.b32 a, 0x43434343;", "prmt.b32 e, a, e, 0x0504;",
    "lop3.b32 m, t, 0x000f000f, 0x43004300, 0xea;", "shl.b32 a, e, 4;", "lop3.b32 $0, a, 0x00300030, m, 0xea;",
    "shr.u32 t, t, 4;", "lop3.b32 $1, t, e, 0x00cf00cf, 0xe4;",
    "lop3.b32 m, u, 0x000f000f, 0x43004300, 0xea;", "shl.b32 a, e, 2;", "lop3.b32 $2, a, 0x00300030, m, 0xea;",
    "shr.u32 u, u, 4;", "lop3.b32 m, u, 0x000f000f, 0x43004300, 0xea;", "shr.u32 a, e, 2;",
    "lop3.b32 $3, a, 0x00300030, m, 0xea;", "}"]))


def _q3k_asm(half: int) -> str:
    """PTX for :func:`q3_bf16`: two low-bit bytes ``$4`` (four 2-bit fields each) and their high-bit bytes ``$5``
    -> ``128 + u`` of fields 0-3 as bf16 pairs (``$0 .. $3``), ``u`` the field with bit ``4 half + s`` of the
    high byte as its bit 2. Bytes spread into 16-bit lanes; each field one ``lop3`` with the magic bits, one
    to move the high bit in."""
    lines = ["{", ".reg .b32 t, h, m, a;", "cvt.u32.u16 t, $4;", "prmt.b32 t, t, 0, 0x4140;", "cvt.u32.u16 h, $5;",
             "prmt.b32 h, h, 0, 0x4140;"]
    for field in range(4):
        bit = 4 * half + field
        move = f"shl.b32 a, h, {2 - bit};" if bit < 2 else "mov.b32 a, h;" if bit == 2 else f"shr.u32 a, h, {bit - 2};"
        lines += [*(["shr.u32 t, t, 2;"] if field else []), "lop3.b32 m, t, 0x00030003, 0x43004300, 0xea;", move,
                  f"lop3.b32 ${field}, a, 0x00040004, m, 0xea;"]
    return "\n".join([*lines, "}"])


# Q2_K: two bytes (four 2-bit fields each) -> 128 + u of fields 0-3 as bf16 pairs ($0 .. $3), one lop3 a pair
Q2K_ASM: tl.constexpr = tl.constexpr("\n".join([
    "{", ".reg .b32 t;", "cvt.u32.u16 t, $4;", "prmt.b32 t, t, 0, 0x4140;",
    "lop3.b32 $0, t, 0x00030003, 0x43004300, 0xea;", "shr.u32 t, t, 2;", "lop3.b32 $1, t, 0x00030003, 0x43004300, 0xea;",
    "shr.u32 t, t, 2;", "lop3.b32 $2, t, 0x00030003, 0x43004300, 0xea;", "shr.u32 t, t, 2;",
    "lop3.b32 $3, t, 0x00030003, 0x43004300, 0xea;", "}"]))
Q3K_ASM0: tl.constexpr = tl.constexpr(_q3k_asm(0))  # Q3_K half 0: high bits 0-3; half 1: bits 4-7
Q3K_ASM1: tl.constexpr = tl.constexpr(_q3k_asm(1))
Q5K_ASM0: tl.constexpr = tl.constexpr(_nibbles5_asm(0))  # Q5_K chunk c: sub-blocks 2c, 2c + 1 -> bits 2c, 2c + 1
Q5K_ASM1: tl.constexpr = tl.constexpr(_nibbles5_asm(2))
Q5K_ASM2: tl.constexpr = tl.constexpr(_nibbles5_asm(4))
Q5K_ASM3: tl.constexpr = tl.constexpr(_nibbles5_asm(6))


@triton.jit
def magic(u, DOT: tl.constexpr):  # type: ignore[no-untyped-def]
    """``OFF + u`` in the dot's dtype, exactly (``0 <= u < 64``): bf16 ``0x4300 | u``, f16 ``0x6400 | u``."""
    if DOT == 1:
        w = (u | 0x4300).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif DOT == 2:
        w = (u | 0x6400).to(tl.uint16).to(tl.float16, bitcast=True)
    else:
        w = (u + 128).to(tl.float32)
    return w


@triton.jit
def nibbles_bf16(q):  # type: ignore[no-untyped-def]
    """Bytes ``q`` (uint8) -> ``(128 + (q & 15), 128 + (q >> 4))`` as bf16, exactly: two bytes at a time, a
    ``prmt`` spreads them into 16-bit lanes and each ``lop3`` makes two values (``(t & 0x000f000f) | 0x43004300``)."""
    return tl.inline_asm_elementwise(asm=NIBBLES_ASM, constraints="=r,=r,h", args=[q],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def nibbles5_bf16(q, h, TEXT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Bytes ``q`` and high-bit bytes ``h`` (uint8) -> ``128 + u`` as bf16 for the low and the high nibbles, each
    with its fifth bit from ``h`` (``TEXT``: one of ``Q5K_ASM*``, which bits)."""
    return tl.inline_asm_elementwise(asm=TEXT, constraints="=r,=r,h,h", args=[q, h],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def nibbles5_word_bf16(q, v):  # type: ignore[no-untyped-def]
    """Q5_0 / Q5_1: bytes ``q`` (uint8) of elements ``l`` and the block's qh word shifted right by ``l`` (int32) ->
    ``128 + u`` as bf16 for the low nibbles (fifth bit: bit 0 of ``v``) and the high (bit 16), by :data:`Q5_ASM`."""
    return tl.inline_asm_elementwise(asm=Q5_ASM, constraints="=r,=r,h,r,r", args=[q, v],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def codebook_bf16(q, TEXT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Bytes ``q`` (uint8) -> the codebook entries of their low and high nibbles as bf16 (``TEXT``: ``IQ4_ASM`` or
    ``FP4_ASM``), two bytes at a time by ``prmt`` table lookups."""
    return tl.inline_asm_elementwise(asm=TEXT, constraints="=r,=r,h", args=[q],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def q2_bf16(q):  # type: ignore[no-untyped-def]
    """Q2_K: bytes ``q`` (uint8) -> ``128 + u`` as bf16 of their four 2-bit fields (:data:`Q2K_ASM`)."""
    return tl.inline_asm_elementwise(asm=Q2K_ASM, constraints="=r,=r,=r,=r,h", args=[q],
                                     dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def q3_bf16(q, hm, TEXT: tl.constexpr):  # type: ignore[no-untyped-def]
    """Q3_K: low-bit bytes ``q`` and high-bit bytes ``hm`` (uint8) of one half -> ``128 + u`` as bf16 of the four
    2-bit fields, each with its high bit (``TEXT``: :data:`Q3K_ASM0` or :data:`Q3K_ASM1`, the half)."""
    return tl.inline_asm_elementwise(asm=TEXT, constraints="=r,=r,=r,=r,h,h", args=[q, hm],
                                     dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def q6_bf16(ql, ql2, qh):  # type: ignore[no-untyped-def]
    """Q6_K: low bytes ``ql`` of row ``r`` and ``ql2`` of row ``r + 2`` of a half (``r < 2``) and their high bytes
    ``qh`` (uint8) -> ``128 + u`` as bf16 of ``(r, low nibble)``, ``(r, high)``, ``(r + 2, low)``, ``(r + 2, high)``
    (:data:`Q6K_ASM`)."""
    return tl.inline_asm_elementwise(asm=Q6K_ASM, constraints="=r,=r,=r,=r,h,h,h", args=[ql, ql2, qh],
                                     dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
