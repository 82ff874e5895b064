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

_INT8X4_TO_F16X4: tl.constexpr = tl.constexpr("""
{
.reg .b32 u, bias;
xor.b32 u, $2, 0x80808080;
mov.b32 bias, 0x64806480;
prmt.b32 $0, u, 0x64646464, 0x5140;
prmt.b32 $1, u, 0x64646464, 0x7362;
sub.f16x2 $0, $0, bias;
sub.f16x2 $1, $1, bias;
}
""")


@triton.jit
def int8_to_f16(q):
    """``q.to(tl.float16)`` for an int8 tensor whose per-thread element count is a multiple of 4: each byte
    ``q + 128`` under the float16 exponent of 1024, minus 1152 (5 instructions per 4 values)."""
    return tl.inline_asm_elementwise(_INT8X4_TO_F16X4, "=r,=r,r", [q], dtype=tl.float16, is_pure=True, pack=4)
