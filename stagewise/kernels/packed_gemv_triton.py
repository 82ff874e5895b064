"""Triton GEMV for packed GGUF weights (every block type): decode and small batches, blocks read as stored.

``y[m] = W[e_m] @ x[m // x_repeat]`` where ``W`` is a packed matrix ``(N, K)`` (one matrix for every
row) or a stack ``(E, N, K)`` gathered by ``expert_index[m]`` (MoE decode reads only the routed
experts), held as planes (:class:`~stagewise.kernels.expert_stacks.PackedStack`). Each program owns
``BLOCK_N`` output rows of one output row ``m`` and walks K in ``BLOCK_K`` steps; each step dequantizes
its blocks in registers (:func:`~stagewise.kernels.packed_blocks_triton.block_values`: each row's step
is one contiguous run of quant bytes, e.g. 512 bytes of Q4_K at ``BLOCK_K = 1024``) and accumulates
``w * x`` in float32, summed once at the end. Q4_K and Q5_K (:data:`SLOT_TYPES`) are read by 8-byte
slots instead, whose 8 + 8 inputs are contiguous, so the input loads share the quant bytes' layout;
each 32-value sub-block's ``scale * sum(q x) - min * sum(x)`` is accumulated, its scales read as the
four 32-bit words of the block's 16 meta bytes. The output is in ``x``'s dtype.

Meant for at most :data:`GEMV_MAX_ROWS` output rows (decode; MoE decode's routed rows): every output
row's programs read the weight tile again (from L2 when the rows share a matrix), so beyond that a
dequantized tile and the device's matmul win. It is correct for any number of rows.

Tile configs are a pure function of the type and shape (:func:`config_for`), never autotuned, so
every pipeline stage reduces in the same order; ``bench/packed_gemv.py`` times candidates inside CUDA
graphs (Q4_K, Q5_K and Q6_K measured, the other types' defaults not).
The values may differ from ``gguf.quants``' in the last bit where the compiler fuses ``d * q + m``
into one FMA; the products' sum differs from a float32 ``x @ W.T`` by summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import PackedStack, check_planes
from stagewise.kernels.gemv_triton import gemv_grid, gemv_tile
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.packed_blocks_triton import block_tile
from stagewise.kernels.triton_launch import dependent_launch, int32_index, launch_device, next_power_of_2
from stagewise.spec.packed_types import block_elements

# types whose GEMV reads 8-byte slots and applies scales once a sub-block
SLOT_TYPES = frozenset({GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K})
GEMV_MAX_ROWS = 16  # output rows (tokens, or routed (token, expert) pairs) the kernel is meant for


@triton.jit
def _input_tile(x_row, k, K):  # type: ignore[no-untyped-def]
    return tl.load(x_row + k, mask=k < K, other=0.0).to(tl.float32)  # in the weight tile's axes


@triton.jit
def _k_slots(q_rows, h_rows, meta32_rows, k0, K, n_mask, TYPE: tl.constexpr, NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of Q4_K / Q5_K super-blocks by 8-byte slots: quant bytes ``32c + 8g + l`` ``(BN, NB, 4, 4, 8)``
    (chunk ``c``, slot ``g``), Q5_K's high-bit bytes ``8g + l`` of the same values (zeros for Q4_K), and
    the scale and min of sub-blocks ``2c`` and ``2c + 1`` ``(BN, NB, 4, 1)`` each.

    A slot's 8 bytes hold values ``64c + 8g + l`` (low nibbles) and ``64c + 32 + 8g + l`` (high): 8
    contiguous inputs each, so the input loads take the quant bytes' layout (one thread, one slot)."""
    b = k0 // 256 + tl.arange(0, NB)
    mask = n_mask[:, None] & (b < K // 256)[None, :]  # (BN, NB)
    m5 = mask[:, :, None, None, None]
    qb = q_rows[:, None] + b[None, :] * 128  # (BN, NB) each super-block's 128 quant bytes
    c = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 4)[None, None, None, :, None]
    l8 = tl.arange(0, 8)[None, None, None, None, :]
    quants = tl.load(qb[:, :, None, None, None] + 32 * c + 8 * g + l8, mask=m5, other=0).to(tl.int32)
    if TYPE == 13:
        hb = h_rows[:, None] + b[None, :] * 32  # (BN, NB) its 32 high-bit bytes
        high = tl.load(hb[:, :, None, None, None] + 8 * g + l8 + 0 * c, mask=m5, other=0).to(tl.int32)
    else:
        high = tl.zeros((1, 1, 1, 1, 1), dtype=tl.int32)
    head = meta32_rows[:, None] + b[None, :] * 4  # (BN, NB) its 16 meta bytes as 32-bit words
    w0 = tl.load(head, mask=mask, other=0)[:, :, None, None]  # d, dmin
    w1 = tl.load(head + 1, mask=mask, other=0)[:, :, None, None]  # scale bytes 0-3
    w2 = tl.load(head + 2, mask=mask, other=0)[:, :, None, None]  # 4-7
    w3 = tl.load(head + 3, mask=mask, other=0)[:, :, None, None]  # 8-11
    c4 = tl.arange(0, 4)[None, None, :, None]
    d = ((w0 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    dmin = (((w0 >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    sh = 16 * (c4 & 1)  # sub-blocks 2c, 2c + 1: scale bytes (2c) & 3 and (2c + 1) & 3 of each word
    lo = c4 < 2
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
    return quants, high, scale0, scale1, min0, min1


@triton.jit
def _k_dot(quants, high, scale0, scale1, min0, min1, x_row, k0, K, TYPE: tl.constexpr,
           NB: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of a Q4_K / Q5_K GEMV from :func:`_k_slots`: ``scale * sum(q * x) - min * sum(x)`` of
    each slot's two sub-blocks, ``(BN, NB, 4, 4)`` (summed over the rest at the end)."""
    b = k0 // 256 + tl.arange(0, NB)[None, :, None, None, None]
    c = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 4)[None, None, None, :, None]
    l8 = tl.arange(0, 8)[None, None, None, None, :]
    at = b * 256 + 64 * c + 8 * g + l8  # (1, NB, 4, 4, 8) the low nibbles' inputs
    in_k = b < K // 256  # constant along a slot, so the loads stay vectors
    x0 = tl.load(x_row + at, mask=in_k, other=0.0).to(tl.float32)
    x1 = tl.load(x_row + at + 32, mask=in_k, other=0.0).to(tl.float32)
    q0 = quants & 15
    q1 = quants >> 4
    if TYPE == 13:
        q0 = q0 | (((high >> (2 * c)) & 1) << 4)
        q1 = q1 | (((high >> (2 * c + 1)) & 1) << 4)
    dot0 = tl.sum(q0.to(tl.float32) * x0, axis=4)
    dot1 = tl.sum(q1.to(tl.float32) * x1, axis=4)
    sum0 = tl.sum(x0, axis=4)
    sum1 = tl.sum(x1, axis=4)
    return scale0 * dot0 - min0 * sum0 + scale1 * dot1 - min1 * sum1


# Q4_K by 32-bit words (WORDS): a quant word's 8 nibbles as float32 128 + q by inline PTX (prmt places a byte's
# nibble under the exponent bits 0x43: one instruction a value, and the word's two masks).
WORD_ASM: tl.constexpr = tl.constexpr("\n".join([
    "{", ".reg .b32 l, h, m;", "mov.b32 m, 0x43000000;", "and.b32 l, $8, 0x0f0f0f0f;", "shr.u32 h, $8, 4;",
    "and.b32 h, h, 0x0f0f0f0f;",
    "prmt.b32 $0, l, m, 0x7044;", "prmt.b32 $1, l, m, 0x7144;", "prmt.b32 $2, l, m, 0x7244;", "prmt.b32 $3, l, m, 0x7344;",
    "prmt.b32 $4, h, m, 0x7044;", "prmt.b32 $5, h, m, 0x7144;", "prmt.b32 $6, h, m, 0x7244;", "prmt.b32 $7, h, m, 0x7344;",
    "}"]))


@triton.jit
def _quarters(t):  # type: ignore[no-untyped-def]
    """``(NB, 4, 4)`` -> four ``(NB, 4)`` along the last dimension, which a thread holds whole (no data moves)."""
    a, b = tl.split(tl.reshape(t, (t.shape[0], t.shape[1], 2, 2)))
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
def _nibble(w, SHIFT: tl.constexpr):  # type: ignore[no-untyped-def]
    """The nibble at bits ``SHIFT``.. of ``w`` as float32 ``128 + q`` (Triton's ops: the interpreter's WORD_ASM)."""
    if SHIFT >= 16:
        t = (w >> (SHIFT - 16)) & 0x000F0000
    else:
        t = (w << (16 - SHIFT)) & 0x000F0000
    return (t | 0x43000000).to(tl.float32, bitcast=True)


@triton.jit
def _word_dot(w, xl0, xl1, xh0, xh1, dl, dh, ASM: tl.constexpr):  # type: ignore[no-untyped-def]
    """``dl += sum_j (128 + lo_j) x_lo[j]`` and ``dh`` likewise for word ``w``'s four bytes: its low nibbles'
    inputs are the bf16 pairs ``xl0``, ``xl1``, its high nibbles' ``xh0``, ``xh1``."""
    if ASM:
        a0, a1, a2, a3, b0, b1, b2, b3 = tl.inline_asm_elementwise(
            asm=WORD_ASM, constraints="=r,=r,=r,=r,=r,=r,=r,=r,r", args=[w],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True, pack=1)
    else:
        a0, a1, a2, a3 = _nibble(w, 0), _nibble(w, 8), _nibble(w, 16), _nibble(w, 24)
        b0, b1, b2, b3 = _nibble(w, 4), _nibble(w, 12), _nibble(w, 20), _nibble(w, 28)
    dl = dl + a0 * _bf16_lane(xl0, False)  # one FMA a value: the chain, never a product summed apart
    dl = dl + a1 * _bf16_lane(xl0, True)
    dl = dl + a2 * _bf16_lane(xl1, False)
    dl = dl + a3 * _bf16_lane(xl1, True)
    dh = dh + b0 * _bf16_lane(xh0, False)
    dh = dh + b1 * _bf16_lane(xh0, True)
    dh = dh + b2 * _bf16_lane(xh1, False)
    dh = dh + b3 * _bf16_lane(xh1, True)
    return dl, dh


@triton.jit
def _pairs_sum(q):  # type: ignore[no-untyped-def]
    p0, p1, p2, p3 = q
    return (_bf16_lane(p0, False) + _bf16_lane(p0, True) + _bf16_lane(p1, False) + _bf16_lane(p1, True)
            + _bf16_lane(p2, False) + _bf16_lane(p2, True) + _bf16_lane(p3, False) + _bf16_lane(p3, True))


@triton.jit
def _q4k_scales(m0, m1, m2, m3, c):  # type: ignore[no-untyped-def]
    """A super-block's meta words (d and dmin, then the 12 scale bytes) -> chunk ``c``'s sub-blocks ``2c`` and
    ``2c + 1``: each one's scale and the offset ``min + 128 scale`` its ``sum(x)`` takes out."""
    d = ((m0 & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    dmin = (((m0 >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)).to(tl.float32)
    sh = 16 * (c & 1)
    lo = c < 2
    a0 = (m1 >> sh) & 0xFF
    a1 = (m1 >> (sh + 8)) & 0xFF
    n0 = (m2 >> sh) & 0xFF
    n1 = (m2 >> (sh + 8)) & 0xFF
    e0 = (m3 >> sh) & 0xFF
    e1 = (m3 >> (sh + 8)) & 0xFF
    s0 = d * tl.where(lo, a0 & 0x3F, (e0 & 0x0F) | ((a0 >> 2) & 0x30)).to(tl.float32)
    s1 = d * tl.where(lo, a1 & 0x3F, (e1 & 0x0F) | ((a1 >> 2) & 0x30)).to(tl.float32)
    k0 = dmin * tl.where(lo, n0 & 0x3F, (e0 >> 4) | ((n0 >> 2) & 0x30)).to(tl.float32) + 128.0 * s0
    k1 = dmin * tl.where(lo, n1 & 0x3F, (e1 >> 4) | ((n1 >> 2) & 0x30)).to(tl.float32) + 128.0 * s1
    return s0, k0, s1, k1


@triton.jit
def _q4k_words_step(accs, q32, m32, x32, n0, N, bk, c3, t, c, stride_q32, stride_m32, BLOCK_N: tl.constexpr,
                    ASM: tl.constexpr, WAIT: tl.constexpr):  # type: ignore[no-untyped-def]
    """One K step of :func:`_q4k_words_kernel`: every row's words and meta first (weights never change: the
    first step reads them before waiting on the kernel that writes ``x``), then the inputs, then each row."""
    weights = ()  # Triton's tuples: no unpacking (*) in a kernel
    for r in tl.static_range(BLOCK_N):
        row = tl.minimum(n0 + r, N - 1).to(tl.int64)  # a row past N reads the last one; its output is not stored
        qo = row * stride_q32 + bk * 32 + 8 * c3 + t  # chunk c's words 0-3, then 4-7
        mo = row * stride_m32 + bk * 4 + t + 0 * c3
        weights = weights + ((tl.load(q32 + qo), tl.load(q32 + qo + 4), tl.load(m32 + mo)),)  # type: ignore[assignment]  # noqa: RUF005
    wait_for_predecessor(WAIT)
    xo = bk * 128 + 32 * c3 + t  # bf16 pairs: chunk c's 32 low-nibble inputs from pair 32c, its high from 32c + 16
    xl0 = _quarters(tl.load(x32 + xo))
    xl1 = _quarters(tl.load(x32 + xo + 4))
    xl2 = _quarters(tl.load(x32 + xo + 8))
    xl3 = _quarters(tl.load(x32 + xo + 12))
    xh0 = _quarters(tl.load(x32 + xo + 16))
    xh1 = _quarters(tl.load(x32 + xo + 20))
    xh2 = _quarters(tl.load(x32 + xo + 24))
    xh3 = _quarters(tl.load(x32 + xo + 28))
    sl = _pairs_sum(xl0) + _pairs_sum(xl1) + _pairs_sum(xl2) + _pairs_sum(xl3)  # once for every row
    sh = _pairs_sum(xh0) + _pairs_sum(xh1) + _pairs_sum(xh2) + _pairs_sum(xh3)
    out = ()
    for r in tl.static_range(BLOCK_N):
        wa, wb, meta = weights[r]  # type: ignore[var-annotated]
        w0, w1, w2, w3 = _quarters(wa)
        w4, w5, w6, w7 = _quarters(wb)
        m0, m1, m2, m3 = _quarters(meta)
        s0, k0, s1, k1 = _q4k_scales(m0, m1, m2, m3, c)
        dl = tl.zeros_like(sl)
        dh = tl.zeros_like(sl)
        p0, p1, p2, p3 = xl0
        q0, q1, q2, q3 = xh0
        dl, dh = _word_dot(w0, p0, p1, q0, q1, dl, dh, ASM)
        dl, dh = _word_dot(w1, p2, p3, q2, q3, dl, dh, ASM)
        p0, p1, p2, p3 = xl1
        q0, q1, q2, q3 = xh1
        dl, dh = _word_dot(w2, p0, p1, q0, q1, dl, dh, ASM)
        dl, dh = _word_dot(w3, p2, p3, q2, q3, dl, dh, ASM)
        p0, p1, p2, p3 = xl2
        q0, q1, q2, q3 = xh2
        dl, dh = _word_dot(w4, p0, p1, q0, q1, dl, dh, ASM)
        dl, dh = _word_dot(w5, p2, p3, q2, q3, dl, dh, ASM)
        p0, p1, p2, p3 = xl3
        q0, q1, q2, q3 = xh3
        dl, dh = _word_dot(w6, p0, p1, q0, q1, dl, dh, ASM)
        dl, dh = _word_dot(w7, p2, p3, q2, q3, dl, dh, ASM)
        out = out + (accs[r] + (s0 * dl - k0 * sl + s1 * dh - k1 * sh),)  # type: ignore[assignment]  # noqa: RUF005
    return out


@triton.jit
def _q4k_words_kernel(x_ptr, qs_ptr, meta_ptr, y_ptr, N, K, stride_xm, stride_qn, stride_mn, stride_ym,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr, GDC: tl.constexpr):
    """Q4_K GEMV by 32-bit words, bf16 input, ``K % BLOCK_K == 0``: one program, ``BLOCK_N`` output rows of
    one input row; a thread owns one 64-value chunk ``c`` of super-block ``b`` (its 8 quant words, two 16-byte
    loads) of every one of the program's rows, so its inputs are loaded and summed once for all of them and
    its scales decoded once a chunk. Each value: one conversion (``WORD_ASM``) and one FMA
    (``bench/sass_count.py --modes G``)."""
    NB: tl.constexpr = BLOCK_K // 256
    tiles = tl.cdiv(N, BLOCK_N)
    rows = tl.num_programs(0) // tiles
    pid = tl.program_id(0)
    m = pid % rows
    n0 = (pid // rows) * BLOCK_N
    q32 = qs_ptr.to(tl.pointer_type(tl.int32))
    m32 = meta_ptr.to(tl.pointer_type(tl.int32))
    x32 = (x_ptr + m * stride_xm).to(tl.pointer_type(tl.int32))
    b = tl.arange(0, NB)[:, None, None]
    c3 = tl.arange(0, 4)[None, :, None]
    t = tl.arange(0, 4)[None, None, :]
    c = tl.arange(0, 4)[None, :]
    accs = ()
    for _r in tl.static_range(BLOCK_N):
        accs = accs + (tl.zeros((NB, 4), tl.float32),)  # type: ignore[assignment]  # noqa: RUF005
    accs = _q4k_words_step(accs, q32, m32, x32, n0, N, b, c3, t, c, stride_qn // 4, stride_mn // 4, BLOCK_N, ASM,
                           GDC)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        accs = _q4k_words_step(accs, q32, m32, x32, n0, N, k0 // 256 + b, c3, t, c, stride_qn // 4, stride_mn // 4,
                               BLOCK_N, ASM, False)
    for r in tl.static_range(BLOCK_N):
        y = tl.sum(tl.sum(accs[r], axis=1), axis=0)
        tl.store(y_ptr + m * stride_ym + n0 + r, y.to(y_ptr.dtype.element_ty), mask=n0 + r < N)


@triton.jit
def _packed_gemv_kernel(
    x_ptr, qs_ptr, qh_ptr, meta_ptr, meta32_ptr, y_ptr, e_ptr,
    N, K,
    stride_xm, stride_qe, stride_qn, stride_he, stride_hn, stride_me, stride_mn, stride_ym,
    x_repeat,
    TYPE: tl.constexpr, SLOTS: tl.constexpr, GATHER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GDC: tl.constexpr,
):
    if GATHER:  # the expert index is the router's output: wait before reading it
        wait_for_predecessor(GDC)
    m, xm, e, offs_n, n_mask = gemv_tile(e_ptr, N, x_repeat, GATHER, BLOCK_N)
    n64 = offs_n.to(tl.int64)
    q_rows = qs_ptr + e * stride_qe + n64 * stride_qn  # (BN,) each row's first byte in each plane
    h_rows = qh_ptr + e * stride_he + n64 * stride_hn
    m_rows = meta_ptr + e * stride_me + n64 * stride_mn
    x_row = x_ptr + xm * stride_xm
    if SLOTS:  # Q4_K / Q5_K by 8-byte slots, scales applied once a sub-block
        NB: tl.constexpr = BLOCK_K // 256
        meta32_rows = meta32_ptr + (e * stride_me + n64 * stride_mn) // 4  # the same meta rows as 32-bit words
        # weights are never written: a plain GEMV reads its first tile while the previous kernel finishes
        qs, hs, s0, s1, n0, n1 = _k_slots(q_rows, h_rows, meta32_rows, 0, K, n_mask, TYPE, NB)
        if not GATHER:
            wait_for_predecessor(GDC)
        part = _k_dot(qs, hs, s0, s1, n0, n1, x_row, 0, K, TYPE, NB)  # (BN, NB, 4, 4)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            qs, hs, s0, s1, n0, n1 = _k_slots(q_rows, h_rows, meta32_rows, k0, K, n_mask, TYPE, NB)
            part += _k_dot(qs, hs, s0, s1, n0, n1, x_row, k0, K, TYPE, NB)
        y = tl.sum(tl.reshape(part, (BLOCK_N, NB * 16)), axis=1)
    else:
        w_first, kk = block_tile(q_rows, h_rows, m_rows, 0, K, n_mask, TYPE, BLOCK_K)  # (BN, blocks, ...) float32
        if not GATHER:
            wait_for_predecessor(GDC)
        acc = w_first * _input_tile(x_row, kk, K)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w, kk = block_tile(q_rows, h_rows, m_rows, k0, K, n_mask, TYPE, BLOCK_K)
            acc += w * _input_tile(x_row, k0 + kk, K)
        y = tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_K)), axis=1)
    tl.store(y_ptr + m * stride_ym + offs_n, y.to(y_ptr.dtype.element_ty), mask=n_mask)


# (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_K is clamped to [the type's block, next_pow2(K)].
# Measured inside CUDA graphs on an H200 at Llama-3.1-8B's shapes (bench/packed_gemv.py ->
# bench/results/packed_h200_r2/packed_gemv_slots_h200.json): (wide, narrow) = the best where N > K
# or the matrix is an LM head, and where N <= K.
T = GGMLQuantizationType
CONFIGS = {
    T.Q4_K: ((4, 1024, 2, 3), (2, 2048, 4, 3)),  # slots: gate/up 29.3 us (1.13 TB/s), head 1.31 TB/s
    T.Q5_K: ((1, 1024, 2, 3), (1, 2048, 4, 3)),  # slots
    T.Q6_K: ((1, 4096, 4, 2), (1, 2048, 4, 3)),  # bytes: 0.74-0.84 TB/s
}
BYTES_CONFIG = (2, 1024, 2, 3)  # the other types (unmeasured): the byte path's best for Q4_K and Q5_K
HEAD_MIN_ELEMENTS = 200_000_000
SLOT_GATHER_CONFIG = (2, 1024, 2, 3)  # routed experts of a slot type: Qwen3-30B-A3B@q4_k decode 254 -> 318 tok/s
GATHER_CONFIG = (4, 512, 4, 3)  # routed experts, K >= 1024
GATHER_SHORT_CONFIG = (4, 256, 2, 4)  # routed experts, short K
WORDS_ASM = True  # the word path's nibbles by inline PTX (else Triton's ops, the same values; the interpreter's)
WORDS_BLOCK_N = 4  # the word path's rows a program (one thread converts and sums its inputs once for all four)
WORDS_STEPS = ((4096, 2), (2048, 1))  # (BLOCK_K, num_warps) by preference: a thread a 64-value chunk


def _word_aligned(plane: torch.Tensor) -> bool:
    """Whether ``plane``'s rows can be read as 32-bit words (every stride a multiple of 4, the start of 16)."""
    return all(st % 4 == 0 for st in plane.stride()[:-1]) and plane.shape[-1] % 4 == 0 and plane.data_ptr() % 16 == 0


def words_config(ggml_type: GGMLQuantizationType, k: int, gather: bool,
                 x_dtype: torch.dtype) -> tuple[int, int, int] | None:
    """``(BLOCK_N, BLOCK_K, num_warps)`` of the word path (:func:`_q4k_words_kernel`), or None where it does not
    apply: Q4_K, one matrix (not an expert stack), bf16 input, ``K`` a multiple of 2048 (a thread a 64-value
    chunk: 32 threads or more). A pure function of its arguments, like :func:`config_for`."""
    if ggml_type != GGMLQuantizationType.Q4_K or gather or x_dtype != torch.bfloat16:
        return None
    for block_k, warps in WORDS_STEPS:
        if k % block_k == 0:
            return WORDS_BLOCK_N, block_k, warps
    return None


def config_for(ggml_type: GGMLQuantizationType, n: int, k: int, gather: bool) -> tuple[int, int, int, int]:
    """The tile config of a ``(n, k)`` weight (``gather``: an expert stack) of ``ggml_type``: a pure
    function of its arguments, so every stage reduces in the same order."""
    if gather and ggml_type in SLOT_TYPES:
        block_n, block_k, warps, stages = SLOT_GATHER_CONFIG
    elif gather:
        block_n, block_k, warps, stages = GATHER_CONFIG if k >= 1024 else GATHER_SHORT_CONFIG
    elif ggml_type in CONFIGS:
        wide, narrow = CONFIGS[ggml_type]
        block_n, block_k, warps, stages = wide if n > k or n * k >= HEAD_MIN_ELEMENTS else narrow
    else:
        block_n, block_k, warps, stages = BYTES_CONFIG
    block_k = max(block_elements(ggml_type), min(block_k, next_power_of_2(k)))
    return block_n, block_k, warps, stages


def packed_gemv(x: torch.Tensor, weight: PackedStack, expert_index: torch.Tensor | None = None, x_repeat: int = 1,
                config: tuple[int, int, int, int] | None = None, slots: bool = True,
                word_config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """``x (M / x_repeat, K)`` (bf16, f16 or f32) -> ``y (M, N)`` in ``x``'s dtype, float32 accumulation.

    ``weight``'s planes hold a packed ``(N, K)`` matrix, or a ``(E, N, K)`` stack, which needs
    ``expert_index (M,)``, the matrix of each output row; output row ``m`` reads input row ``m //
    x_repeat`` (a token's routed experts share its row). No host synchronization, output sized by
    shapes only (CUDA graph safe). Q4_K with bf16 input takes the word path where :func:`words_config` has
    one. ``config`` overrides :func:`config_for` (and the word path), ``word_config`` the word path's own
    and ``slots=False`` turns the slot and word paths of :data:`SLOT_TYPES` off (benchmarks only).
    """
    qs, qh, meta, ggml_type, k = weight.qs, weight.qh, weight.meta, weight.ggml_type, weight.in_features
    check_planes(qs, qh, meta, ggml_type, k)
    n = qs.shape[-2]
    gather = qs.dim() == 3
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0] * x_repeat
    if gather and (expert_index is None or expert_index.numel() != m):
        raise ValueError("a 3-D packed stack needs one expert index per output row")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    words = words_config(ggml_type, k, gather, x.dtype) if slots and config is None else None
    if words is not None and word_config is not None:
        if k % word_config[1]:
            raise ValueError(f"the word path's BLOCK_K {word_config[1]} must divide K {k}")
        words = word_config
    if words is not None:
        _words_gemv(x2, qs, meta, y, words)
        return y
    block_n, block_k, warps, stages = config or config_for(ggml_type, n, k, gather)
    use_slots = slots and ggml_type in SLOT_TYPES
    if use_slots and not _word_aligned(meta):  # the path is a function of type and shape only: never switch on an address
        raise ValueError(f"{ggml_type.name} meta rows must start 16-byte aligned with strides a multiple of 4 bytes")
    meta32 = meta.view(torch.int32) if use_slots else meta  # the super-blocks' 16 meta bytes as 32-bit words
    qh_arg = qh if qh.shape[-1] else qs  # no high plane: any pointer (never read)
    e = int32_index(expert_index) if gather and expert_index is not None else y  # unused if 2-D

    def strides(p: torch.Tensor) -> tuple[int, int]:
        return (p.stride(0) if gather else 0), p.stride(-2)

    with launch_device(x):
        _packed_gemv_kernel[gemv_grid(n, block_n, m)](
            x2, qs, qh_arg, meta, meta32, y, e, n, k,
            x2.stride(0), *strides(qs), *strides(qh_arg), *strides(meta), y.stride(0), x_repeat,
            TYPE=int(ggml_type), SLOTS=use_slots, GATHER=gather, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps, num_stages=stages, **dependent_launch(x),
        )
    return y


def _words_gemv(x2: torch.Tensor, qs: torch.Tensor, meta: torch.Tensor, y: torch.Tensor,
                config: tuple[int, int, int]) -> None:
    """Launch :func:`_q4k_words_kernel` (``x2`` bf16 ``(M, K)``, planes of one ``(N, K)`` Q4_K matrix)."""
    if not (_word_aligned(qs) and _word_aligned(meta)):  # the path is a function of type and shape: never switch on an address
        raise ValueError("Q4_K quant and meta rows must start 16-byte aligned with strides a multiple of 4 bytes")
    if x2.data_ptr() % 4 or x2.stride(0) % 2:  # read as bf16 pairs: a view at an odd element is copied (same values)
        x2 = x2.clone(memory_format=torch.contiguous_format)
    block_n, block_k, warps = config
    n, k = qs.shape[-2], x2.shape[1]
    with launch_device(x2):
        _q4k_words_kernel[gemv_grid(n, block_n, x2.shape[0])](
            x2, qs, meta, y, n, k, x2.stride(0), qs.stride(0), meta.stride(0), y.stride(0),
            BLOCK_N=block_n, BLOCK_K=block_k, ASM=WORDS_ASM and x2.is_cuda, num_warps=warps, num_stages=1,
            **dependent_launch(x2),
        )
