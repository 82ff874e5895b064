"""int8 -> bfloat16 in registers without the GPU's conversion unit: the "magic number" conversion.

A Hopper SM converts integers to floats (``I2F``) at 16 values per clock: at ~3 TB/s of Q8_0 weights
a decode GEMM needs ~12 per clock per SM, so the conversion, not memory, bounds it. Here four int8
values packed in one 32-bit register become four bfloat16 with integer and float adds only:

1. ``u = q ^ 0x80`` per byte: ``q + 128`` as an unsigned byte;
2. each byte placed under the float32 exponent of 2**23 (``prmt``): the float ``2**23 + u``;
3. ``- (2**23 + 128)``: exactly ``q`` as a float32;
4. the upper halves of two such floats (``prmt``) are two bfloat16 — exact, since ``|q| <= 128`` has at
   most 8 significant bits and the low 16 bits of its float32 are zero.

Bit for bit what ``q.to(tl.bfloat16)`` gives. CUDA (NVIDIA PTX) only: callers keep ``q.to`` elsewhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

_INT8X4_TO_BF16X4: tl.constexpr = tl.constexpr("""
{
.reg .b32 u, f0, f1, f2, f3;
xor.b32 u, $2, 0x80808080;
prmt.b32 f0, u, 0x4B000000, 0x7440;
prmt.b32 f1, u, 0x4B000000, 0x7441;
prmt.b32 f2, u, 0x4B000000, 0x7442;
prmt.b32 f3, u, 0x4B000000, 0x7443;
sub.f32 f0, f0, 0f4B000080;
sub.f32 f1, f1, 0f4B000080;
sub.f32 f2, f2, 0f4B000080;
sub.f32 f3, f3, 0f4B000080;
prmt.b32 $0, f0, f1, 0x7632;
prmt.b32 $1, f2, f3, 0x7632;
}
""")


@triton.jit
def int8_to_bf16(q):
    """``q.to(tl.bfloat16)`` for an int8 tensor whose per-thread element count is a multiple of 4 (module doc)."""
    return tl.inline_asm_elementwise(_INT8X4_TO_BF16X4, "=r,=r,r", [q], dtype=tl.bfloat16, is_pure=True, pack=4)
