"""The plane repack of packed GGUF rows: each block's bytes split into quant, high-bit and meta planes.

:func:`split_planes` turns file rows ``raw`` uint8 ``(..., rows, row_bytes)`` into ``(qs, qh, meta)``,
each uint8 ``(..., rows, plane_bytes)`` with the blocks in order
(:class:`~stagewise.spec.packed_types.PlaneLayout`); :func:`join_planes` is its exact inverse. Only
bytes move: the planes hold the file's bytes, so the dequantized values are the file's bit for bit, and
the resident size is the file's. Both run on any device as a few gathers; :func:`planes_from_rows`
repacks a whole tensor a bounded slab of rows at a time, straight into preallocated planes on the
target device (the loader's path: the host never holds more than a slab beyond the file mapping).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.spec.packed_types import PLANES, plane_row_bytes

REPACK_SLAB_BYTES = 64 << 20  # file bytes repacked at a time while loading (on the device)

Planes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (qs, qh, meta), uint8 (..., rows, plane bytes)


def _meta_index(ggml_type: GGMLQuantizationType, device: torch.device) -> torch.Tensor:
    layout = PLANES[ggml_type]
    return torch.cat([torch.arange(lo, hi, device=device) for lo, hi in layout.meta_ranges()])  # (meta_bytes,)


def split_planes(raw: torch.Tensor, ggml_type: GGMLQuantizationType) -> Planes:
    """File rows ``raw`` uint8 ``(..., rows, row_bytes)`` -> ``(qs, qh, meta)`` planes on ``raw``'s device."""
    layout = PLANES[ggml_type]
    lead = raw.shape[:-1]
    nblocks = raw.shape[-1] // layout.block_bytes
    blocks = raw.reshape(*lead, nblocks, layout.block_bytes)  # (..., rows, nblocks, block_bytes)
    qs = blocks[..., layout.qs[0] : layout.qs[1]].reshape(*lead, nblocks * layout.qs_bytes)
    qh = blocks[..., layout.qh[0] : layout.qh[1]].reshape(*lead, nblocks * layout.qh_bytes)
    meta = blocks.index_select(-1, _meta_index(ggml_type, raw.device)).reshape(*lead, nblocks * layout.meta_bytes)
    return qs.contiguous(), qh.contiguous(), meta.contiguous()


def join_planes(qs: torch.Tensor, qh: torch.Tensor, meta: torch.Tensor, ggml_type: GGMLQuantizationType) -> torch.Tensor:
    """The file rows ``(..., rows, row_bytes)`` back from their planes (exactly the bytes split)."""
    layout = PLANES[ggml_type]
    lead = qs.shape[:-1]
    nblocks = qs.shape[-1] // layout.qs_bytes
    raw = torch.empty((*lead, nblocks, layout.block_bytes), dtype=torch.uint8, device=qs.device)
    raw[..., layout.qs[0] : layout.qs[1]] = qs.reshape(*lead, nblocks, layout.qs_bytes)
    raw[..., layout.qh[0] : layout.qh[1]] = qh.reshape(*lead, nblocks, layout.qh_bytes)
    at = 0
    entry = meta.reshape(*lead, nblocks, layout.meta_bytes)
    for lo, hi in layout.meta_ranges():
        raw[..., lo:hi] = entry[..., at : at + hi - lo]
        at += hi - lo
    return raw.reshape(*lead, nblocks * layout.block_bytes)


def empty_planes(lead: tuple[int, ...], ggml_type: GGMLQuantizationType, in_features: int,
                 device: torch.device) -> Planes:
    """Uninitialized planes for rows of ``in_features`` values, of shape ``(*lead, plane bytes)``."""
    return tuple(torch.empty((*lead, n), dtype=torch.uint8, device=device)  # type: ignore[return-value]
                 for n in plane_row_bytes(ggml_type, in_features))


def planes_from_rows(raw: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int, device: torch.device,
                     check: Callable[[torch.Tensor], None] | None = None) -> Planes:
    """Planes on ``device`` of ``raw`` ``(..., rows, row_bytes)`` (any device; typically a CPU view of the
    file mapping), repacked :data:`REPACK_SLAB_BYTES` of rows at a time on ``device``; ``check`` sees
    each slab of file rows there first (the block-scale check)."""
    lead = raw.shape[:-1]
    flat = raw.reshape(-1, raw.shape[-1])  # (R, row_bytes)
    planes = empty_planes((flat.shape[0],), ggml_type, in_features, device)
    step = max(1, REPACK_SLAB_BYTES // max(1, flat.shape[1]))
    for lo in range(0, flat.shape[0], step):
        slab = flat[lo : lo + step].to(device)  # (r, row_bytes)
        if check is not None:
            check(slab)
        for plane, part in zip(planes, split_planes(slab, ggml_type), strict=True):
            plane[lo : lo + slab.shape[0]] = part
    return tuple(p.reshape(*lead, p.shape[-1]) for p in planes)  # type: ignore[return-value]
