"""Block dequantization of every packed GGUF type (Q4_0 … Q8_0, Q2_K … Q6_K, IQ4_NL, IQ4_XS, MXFP4), in torch.

Each function takes the raw blocks as a ``uint8`` tensor of shape ``(n_blocks, type_bytes)`` on
any device and returns ``float32`` values ``(n_blocks, block_elements)``, bit-identical to
``gguf.quants.dequantize`` (same operations in the same order, all in float32).
The expanded types (IQ1_*, IQ2_*, IQ3_*, TQ*) go through ``gguf.quants`` itself on the CPU
(:func:`dequantize_expanded`).
"""

from __future__ import annotations

from collections.abc import Callable

import gguf.quants
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

QK_K = 256


def _f16(blocks: torch.Tensor, lo: int) -> torch.Tensor:
    return blocks[:, lo : lo + 2].contiguous().view(torch.float16).to(torch.float32)  # (n, 1)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Low nibbles then high nibbles of each ``group``-byte run: (n, m*group) -> (n, m*2*group)."""
    n = qs.shape[0]
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).reshape(1, 1, 2, 1)
    return ((qs.reshape(n, -1, 1, group) >> shifts) & 0x0F).reshape(n, -1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of a little-endian uint32 (given as 4 bytes), bit i at index i: (n, 4) -> (n, 32)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device).reshape(1, 1, 8)
    return ((qh.reshape(-1, 4, 1) >> shifts) & 1).reshape(-1, 32)


def q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    qs = _nibbles(blocks[:, 2:], 16).to(torch.int8) - 8
    return d * qs.to(torch.float32)


def q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    qs = _nibbles(blocks[:, 4:], 16).to(torch.float32)
    return (d * qs) + m


def q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    qh = _bits32(blocks[:, 2:6])
    ql = _nibbles(blocks[:, 6:], 16)
    qs = (ql | (qh << 4)).to(torch.int8) - 16
    return d * qs.to(torch.float32)


def q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = _f16(blocks, 0), _f16(blocks, 2)
    qh = _bits32(blocks[:, 4:8])
    ql = _nibbles(blocks[:, 8:], 16)
    qs = (ql | (qh << 4)).to(torch.float32)
    return (d * qs) + m


def _crumbs(qs: torch.Tensor) -> torch.Tensor:
    """Q2_K / Q3_K / Q6_K 2-bit fields: 32-byte runs, bit pairs 0, 2, 4, 6: (n, m*32) -> (n, m*4*32)."""
    n = qs.shape[0]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=qs.device).reshape(1, 1, 4, 1)
    return ((qs.reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1)


def _bit_planes(qh: torch.Tensor) -> torch.Tensor:
    """Q3_K / Q5_K high bits: one 32-byte run, bit b of byte j is value 32b + j: (n, 32) -> (n, 256)."""
    n = qh.shape[0]
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device).reshape(1, 1, 8, 1)
    return ((qh.reshape(n, -1, 1, 32) >> shifts) & 1).reshape(n, -1)


def _lookup(table: tuple[int, ...], index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` as float32 (the 16-entry codebooks of IQ4_NL / IQ4_XS / MXFP4)."""
    values = torch.tensor(table, dtype=torch.float32, device=index.device)
    return values[index.to(torch.int64)]


def q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, : QK_K // 16]
    d, dmin = _f16(blocks, QK_K // 16 + QK_K // 4), _f16(blocks, QK_K // 16 + QK_K // 4 + 2)
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, QK_K // 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, QK_K // 16, 1)
    qs = _crumbs(blocks[:, QK_K // 16 : QK_K // 16 + QK_K // 4]).reshape(n, QK_K // 16, 16).to(torch.float32)
    return (dl * qs - ml).reshape(n, QK_K)


def q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask = blocks[:, : QK_K // 8]
    qs = blocks[:, QK_K // 8 : QK_K // 8 + QK_K // 4]
    packed = blocks[:, QK_K // 8 + QK_K // 4 : QK_K // 8 + QK_K // 4 + 12]
    d = _f16(blocks, QK_K // 8 + QK_K // 4 + 12)
    low = _nibbles(packed[:, :8], 8)  # (n, 16): low nibbles of bytes 0-7, then their high nibbles
    high = (packed[:, 8:].reshape(n, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8,
                                                            device=blocks.device).reshape(1, 4, 1))
    high = (high.reshape(n, 16) & 0x03) << 4
    scales = ((low | high).to(torch.int8) - 32).to(torch.float32)
    dl = (d * scales).reshape(n, 16, 1)
    ql = _crumbs(qs).reshape(n, 16, QK_K // 16)
    qh = _bit_planes(hmask).reshape(n, 16, QK_K // 16) ^ 1  # the offset is 4 where the mask bit is 0
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: twelve bytes -> eight 6-bit scales and eight 6-bit mins."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn  # (n, 8) each


def q4_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    scale = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    offset = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    qs = _nibbles(blocks[:, 16:], 32).reshape(n, -1, 32).to(torch.float32)
    return (scale * qs - offset).reshape(n, QK_K)


def q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = _k_scale_min(blocks[:, 4:16])
    scale = (d * sc.to(torch.float32)).reshape(n, -1, 1)
    offset = (dmin * mn.to(torch.float32)).reshape(n, -1, 1)
    qh_bytes = blocks[:, 16 : 16 + QK_K // 8]
    ql = _nibbles(blocks[:, 16 + QK_K // 8 :], 32).reshape(n, -1, 32)
    shifts = torch.arange(8, dtype=torch.uint8, device=blocks.device).reshape(1, 1, 8, 1)
    qh = ((qh_bytes.reshape(n, -1, 1, 32) >> shifts) & 1).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (scale * q - offset).reshape(n, QK_K)


def q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    ql_bytes = blocks[:, : QK_K // 2]
    qh_bytes = blocks[:, QK_K // 2 : QK_K // 2 + QK_K // 4]
    scales = blocks[:, QK_K // 2 + QK_K // 4 : QK_K // 2 + QK_K // 4 + QK_K // 16]
    d = _f16(blocks, QK_K // 2 + QK_K // 4 + QK_K // 16)
    scale = (d * scales.contiguous().view(torch.int8).to(torch.float32)).reshape(n, QK_K // 16, 1)
    ql = _nibbles(ql_bytes, 64).reshape(n, -1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=blocks.device).reshape(1, 1, 4, 1)
    qh = ((qh_bytes.reshape(n, -1, 1, 32) >> shifts) & 0x03).reshape(n, -1, 32)
    q = (ql | (qh << 4)).to(torch.int8) - 32
    return (scale * q.reshape(n, QK_K // 16, -1).to(torch.float32)).reshape(n, QK_K)


IQ4_KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # gguf IQ4_NL.kvalues
MXFP4_KVALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1, doubled (gguf MXFP4.kvalues)


def iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    return d * _lookup(IQ4_KVALUES, _nibbles(blocks[:, 2:], 16))


def iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    d = _f16(blocks, 0)
    scales_h = blocks[:, 2:4].to(torch.int32)
    scales_h = scales_h[:, 0:1] | (scales_h[:, 1:2] << 8)  # (n, 1) little-endian uint16
    shifts = torch.arange(0, 16, 2, dtype=torch.int32, device=blocks.device).reshape(1, 8)
    high = ((scales_h >> shifts) & 0x03).to(torch.uint8)  # (n, 8)
    low = ((blocks[:, 4:8].reshape(n, 4, 1) >> torch.tensor([0, 4], dtype=torch.uint8, device=blocks.device)
            .reshape(1, 1, 2)) & 0x0F).reshape(n, 8)  # sub-block i: nibble i % 2 of byte i // 2
    scales = ((low | (high << 4)).to(torch.int8) - 32).to(torch.float32)
    dl = (d * scales).reshape(n, QK_K // 32, 1)
    qs = _lookup(IQ4_KVALUES, _nibbles(blocks[:, 8:], 16)).reshape(n, QK_K // 32, 32)
    return (dl * qs).reshape(n, QK_K)


def e8m0_to_fp32_half(e: torch.Tensor) -> torch.Tensor:
    """MXFP4's shared exponent byte as float32 ``2**(e - 128)`` (half the E8M0 scale, since the
    e2m1 codebook is doubled), as ``ggml_e8m0_to_fp32_half``: subnormal for ``e < 2``."""
    x = e.to(torch.int32)
    bits = torch.where(x < 2, 0x00200000 << x, (x - 1) << 23)
    return bits.view(torch.float32)


def mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    d = e8m0_to_fp32_half(blocks[:, 0:1])
    return d * _lookup(MXFP4_KVALUES, _nibbles(blocks[:, 1:], 16))


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    return blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q4_0: q4_0,
    GGMLQuantizationType.Q4_1: q4_1,
    GGMLQuantizationType.Q5_0: q5_0,
    GGMLQuantizationType.Q5_1: q5_1,
    GGMLQuantizationType.Q8_0: q8_0,
    GGMLQuantizationType.Q2_K: q2_k,
    GGMLQuantizationType.Q3_K: q3_k,
    GGMLQuantizationType.Q4_K: q4_k,
    GGMLQuantizationType.Q5_K: q5_k,
    GGMLQuantizationType.Q6_K: q6_k,
    GGMLQuantizationType.IQ4_NL: iq4_nl,
    GGMLQuantizationType.IQ4_XS: iq4_xs,
    GGMLQuantizationType.MXFP4: mxfp4,
}


def dequantize(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...],
               chunk_blocks: int = 1 << 16) -> torch.Tensor:
    """Dense float32 tensor of ``shape`` from ``raw`` (flat uint8 blocks), on ``raw``'s device.

    Works in chunks of ``chunk_blocks`` blocks so the float32 temporaries stay small.
    """
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    fn = DEQUANTIZERS[qtype]
    blocks = raw.reshape(-1, type_bytes)
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32, device=raw.device)
    for lo in range(0, blocks.shape[0], chunk_blocks):
        out[lo : lo + chunk_blocks] = fn(blocks[lo : lo + chunk_blocks])
    return out.reshape(shape)


EXPANDED_CHUNK_BLOCKS = 1 << 14  # blocks per gguf.quants call (16384 IQ blocks: 16 MiB of float32 values)


def dequantize_expanded(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> torch.Tensor:
    """Dense float32 tensor of ``shape`` (CPU) from ``raw`` (flat CPU uint8 blocks) of a type that is
    dequantized at load (IQ1_*, IQ2_*, IQ3_*, TQ1_0, TQ2_0), through ``gguf.quants.dequantize``.

    The numpy reference runs on ``EXPANDED_CHUNK_BLOCKS`` blocks at a time, so its temporaries
    (several times the chunk's float32 size) stay bounded; values are its bits exactly.
    """
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, type_bytes).numpy()
    out = torch.empty(blocks.shape[0], block, dtype=torch.float32)
    for lo in range(0, blocks.shape[0], EXPANDED_CHUNK_BLOCKS):
        part = blocks[lo : lo + EXPANDED_CHUNK_BLOCKS]
        out[lo : lo + part.shape[0]] = torch.from_numpy(gguf.quants.dequantize(part, qtype).reshape(-1, block))
    return out.reshape(shape)
