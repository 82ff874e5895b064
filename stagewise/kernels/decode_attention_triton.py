"""Decode attention over the KV cache in Triton: one new token per sequence, split over its keys.

Replaces, for a one-token step, SDPA with an explicit mask (cuDNN's prefill kernel, ~24 µs per
layer at a 1,024-key bucket on an H200) by two launches (the cache was written before, by
:func:`stagewise.kernels.rope_store_triton.rope_store`):

- the split kernel: each program takes one KV head of one sequence (all ``G`` query heads that
  share it, as the rows of one ``tl.dot``) over one of that sequence's key ranges, and writes its
  partial softmax (running max, sum, weighted values) in float32;
- the combine kernel: merges a head's partials in index order, divides, applies the optional sigmoid
  output gate (Qwen3.5 / 3.6) and writes ``(B, 1, H*D)``, ready for ``o_proj``.

The cache is paged (:mod:`stagewise.models.block_table`): a range is block-aligned (a multiple of
``BLOCK_KEYS``, itself a multiple of the block) and each tile of it is one block, found with one
block-table load. Every (sequence, KV head) has the same number of ranges,
:func:`~stagewise.spec.decode_splits.decode_splits` of the model's KV heads; a sequence of ``n``
positions (read from the positions tensor on the device) cuts its ``n`` keys into ranges of
``ceil(n / splits)`` keys rounded up to ``BLOCK_KEYS``, and ranges past its keys do nothing (the
combine, which derives the same ranges from the same position, reads only the used ones). The grid,
the ranges and the order of every reduction are thus functions of each sequence's own position and of
the model's constants: a sequence's output is the same bits whatever shares its batch, one captured
graph serves every length as positions advance (no attended-length argument), and a staged run and a
single-device run stay bit-identical.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.kv_block_attention_triton import attend_kv_block
from stagewise.kernels.triton_launch import dependent_launch, launch_device, next_power_of_2
from stagewise.spec.decode_splits import decode_splits
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS

BLOCK_KEYS = KV_BLOCK_TOKENS  # a range's granularity: one key tile of the largest block
MERGE_SPLITS = 16  # partials the combine loads at once: (MERGE_SPLITS, D) float32 in registers


@triton.jit
def _range_keys(valid, SPLITS: tl.constexpr, BLOCK_KEYS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Keys per range of a sequence with ``valid`` keys: ``ceil(valid / SPLITS)`` rounded up to ``BLOCK_KEYS``."""
    return tl.cdiv(tl.cdiv(valid, SPLITS), BLOCK_KEYS) * BLOCK_KEYS


@triton.jit
def _split_kernel(
    q_ptr, kc_ptr, vc_ptr, table_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
    kv_heads, groups, dim, sm_scale_log2,
    stride_qb, stride_qh, stride_cb, stride_ch, stride_cl, stride_tb, stride_sb, stride_sh,
    SPLITS: tl.constexpr, BLOCK_KEYS: tl.constexpr, G_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_L: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    bh = tl.program_id(0)  # (sequence, kv head)
    s = tl.program_id(1)  # key range of this sequence
    b = bh // kv_heads
    kvh = bh % kv_heads
    valid = tl.load(pos_ptr + b).to(tl.int32) + 1  # keys 0 .. position
    per = _range_keys(valid, SPLITS, BLOCK_KEYS)
    lo = s * per
    hi = tl.minimum(lo + per, valid)
    if lo < hi:  # a range past the keys does nothing and writes nothing
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, BLOCK_D)
        g_mask = g < groups
        d_mask = d < dim
        heads = kvh * groups + g  # the query heads that share this kv head
        q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                    mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # (G, D)
        m_i = tl.full((G_PAD,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((G_PAD,), dtype=tl.float32)
        acc = tl.zeros((G_PAD, BLOCK_D), dtype=tl.float32)
        head = kvh.to(tl.int64) * stride_ch
        offs_l = tl.arange(0, BLOCK_L)
        for start in range(lo, hi, BLOCK_L):  # a tile is one block (BLOCK_L == block tokens; lo is block-aligned)
            block = tl.load(table_ptr + b * stride_tb + start // BLOCK_L).to(tl.int64)  # one lookup per block
            keys = start + offs_l
            k_mask = keys < hi
            m_i, l_i, acc = attend_kv_block(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, block, head, kvh, offs_l, d, d_mask,
                                            k_mask, k_mask[None, :], m_i, l_i, acc, sm_scale_log2, stride_cb,
                                            stride_cl, stride_sb, stride_sh, IEEE, FP8)
        row = (b * kv_heads * groups + heads) * SPLITS + s  # (sequence, query head, range)
        tl.store(m_ptr + row, m_i, mask=g_mask)
        tl.store(l_ptr + row, l_i, mask=g_mask)
        tl.store(acc_ptr + row[:, None] * dim + d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, pos_ptr, gate_ptr, out_ptr,
    heads, dim, stride_gb, stride_gh,
    SPLITS: tl.constexpr, BLOCK_KEYS: tl.constexpr, MERGE: tl.constexpr, HAS_GATE: tl.constexpr,
    BLOCK_D: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)  # (sequence, query head)
    b = row // heads
    h = row % heads
    valid = tl.load(pos_ptr + b).to(tl.int32) + 1
    used = tl.cdiv(valid, _range_keys(valid, SPLITS, BLOCK_KEYS))  # the ranges the split kernel wrote
    s = tl.arange(0, SPLITS)
    s_mask = s < used
    m = tl.load(m_ptr + row * SPLITS + s, mask=s_mask, other=float("-inf"))
    m_max = tl.max(m, axis=0)
    w = tl.where(s_mask, tl.exp2(m - m_max), 0.0)
    l_sum = tl.sum(w * tl.load(l_ptr + row * SPLITS + s, mask=s_mask, other=0.0), axis=0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < dim
    out = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for first in range(0, used, MERGE):  # MERGE partials at a time, in index order
        sc = first + tl.arange(0, MERGE)
        sc_mask = sc < used
        wc = tl.where(sc_mask, tl.exp2(tl.load(m_ptr + row * SPLITS + sc, mask=sc_mask, other=0.0) - m_max), 0.0)
        acc = tl.load(acc_ptr + (row * SPLITS + sc)[:, None] * dim + d[None, :],
                      mask=sc_mask[:, None] & d_mask[None, :], other=0.0)  # (MERGE, D)
        out += tl.sum(acc * wc[:, None], axis=0)
    out = out / l_sum
    if HAS_GATE:
        gate = tl.load(gate_ptr + b * stride_gb + h * stride_gh + d, mask=d_mask, other=0.0).to(tl.float32)
        out = out.to(out_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(gate)  # round as the torch path does
    tl.store(out_ptr + row * dim + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                     positions: torch.Tensor, gate: torch.Tensor | None = None,
                     scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of one token per sequence: ``q`` ``(B, 1, H, D)`` (D contiguous) over the keys
    ``0 .. positions[b]`` of sequence ``b`` (``positions`` ``(B, 1)`` on the device, read there: no length
    on the host) in the paged caches ``(blocks, kvH, block_tokens, D)``: key ``p`` in block
    ``block_table[b, p // block_tokens]`` (``(B, blocks per row)`` int32), offset ``p % block_tokens``;
    ``block_tokens`` a power of two in 16..BLOCK_KEYS. Scale ``1/sqrt(D)``. Returns ``(B, 1, H*D)`` in
    ``q``'s dtype, times ``sigmoid(gate)`` when ``gate`` ``(B, 1, H, D)`` (any batch/head strides) is
    given. With ``scales`` (float8 caches' key and value scales ``(blocks, kvH, block_tokens)`` float32) a
    key's score and a value's weight are multiplied by its position's scale. Row ``b``'s result depends
    only on row ``b``'s inputs (module note)."""
    batch, steps, heads, dim = q.shape
    kv_heads, block_tokens = key_cache.shape[1], key_cache.shape[2]
    if steps != 1:
        raise ValueError("decode_attention takes one token per sequence")
    if BLOCK_KEYS % block_tokens or block_tokens < 16 or block_table.stride(-1) != 1:
        raise ValueError(f"decode_attention needs blocks of 16..{BLOCK_KEYS} positions dividing {BLOCK_KEYS} "
                         f"and a row-contiguous block table, got {block_tokens}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    groups = heads // kv_heads
    splits = decode_splits(kv_heads)
    dev = q.device
    m = torch.empty((batch, heads, splits), dtype=torch.float32, device=dev)
    l_sum = torch.empty_like(m)
    acc = torch.empty((batch, heads, splits, dim), dtype=torch.float32, device=dev)
    out = torch.empty((batch, 1, heads * dim), dtype=q.dtype, device=dev)
    pos = positions.reshape(-1)
    block_d = next_power_of_2(dim)
    key_scale, value_scale = scales if scales is not None else (m, m)  # unused without fp8
    with launch_device(q):
        _split_kernel[(batch * kv_heads, splits)](
            q, key_cache, value_cache, block_table, pos, m, l_sum, acc, key_scale, value_scale,
            kv_heads, groups, dim, 1.4426950408889634 / dim**0.5,
            q.stride(0), q.stride(2), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            block_table.stride(0), key_scale.stride(0) if scales is not None else 0,
            key_scale.stride(1) if scales is not None else 0,
            SPLITS=splits, BLOCK_KEYS=BLOCK_KEYS, G_PAD=max(16, next_power_of_2(groups)), BLOCK_D=block_d,
            BLOCK_L=block_tokens, IEEE=q.dtype == torch.float32, FP8=scales is not None, num_warps=4, num_stages=2,
            **dependent_launch(q),
        )
        if gate is not None and gate.stride(-1) != 1:
            gate = gate.contiguous()
        g = gate if gate is not None else out
        _combine_kernel[(batch * heads,)](
            m, l_sum, acc, pos, g, out, heads, dim, g.stride(0), g.stride(2) if gate is not None else 0,
            SPLITS=splits, BLOCK_KEYS=BLOCK_KEYS, MERGE=min(MERGE_SPLITS, splits), HAS_GATE=gate is not None,
            BLOCK_D=block_d, num_warps=2, **dependent_launch(q),
        )
    return out
