"""Block dequantization of llama.cpp's Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, in torch.

Each function takes the raw blocks as a ``uint8`` tensor of shape ``(n_blocks, type_bytes)`` on
any device and returns ``float32`` values ``(n_blocks, block_elements)``, bit-identical to
``gguf.quants.dequantize`` (same operations in the same order, all in float32).
"""

from __future__ import annotations

from collections.abc import Callable

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


def q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = _f16(blocks, 0)
    return blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32) * d


DEQUANTIZERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q4_0: q4_0,
    GGMLQuantizationType.Q4_1: q4_1,
    GGMLQuantizationType.Q5_0: q5_0,
    GGMLQuantizationType.Q5_1: q5_1,
    GGMLQuantizationType.Q8_0: q8_0,
    GGMLQuantizationType.Q4_K: q4_k,
    GGMLQuantizationType.Q5_K: q5_k,
    GGMLQuantizationType.Q6_K: q6_k,
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
