"""Decode attention over the KV cache in Triton: one new token per sequence, split over the keys.

Replaces, for a one-token step, SDPA with an explicit mask (cuDNN's prefill kernel, ~24 µs per
layer at a 1,024-key bucket on an H200) by two launches (the cache was written before, by
:func:`stagewise.kernels.rope_store_triton.rope_store`):

- the split kernel: each program takes one KV head of one sequence (all ``G`` query heads that
  share it, as the rows of one ``tl.dot``) over one slice of the attended keys, and writes its
  partial softmax (running max, sum, weighted values) in float32;
- the combine kernel: merges a head's slices in index order, divides, applies the optional sigmoid
  output gate (Qwen3.5 / 3.6) and writes ``(B, 1, H*D)``, ready for ``o_proj``.

The cache is paged (:mod:`stagewise.models.block_table`): a split's key range is block-aligned
(slices are multiples of ``BLOCK_KEYS``, a multiple of the block) and each tile of it is one block,
found with one block-table load. Keys past a sequence's position are never read (the causal mask, taken from the positions tensor
on the device, so a captured graph stays valid as positions advance). The slicing is a pure
function of the attended length (``kv_length``, the graph's bucket): a staged run and a
single-device run reduce in the same order and stay bit-identical.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import dependent_launch, launch_device

BLOCK_KEYS = 64
TARGET_SLICES = 16  # slices per KV head: enough programs to keep the SMs reading at short context


@triton.jit
def _split_kernel(
    q_ptr, kc_ptr, vc_ptr, table_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr, ks_ptr, vs_ptr,
    kv_heads, groups, dim, keys_per_slice, slices, sm_scale_log2,
    stride_qb, stride_qh, stride_cb, stride_ch, stride_cl, stride_tb, stride_sb, stride_sh,
    G_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr,
    GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    bh = tl.program_id(0)  # (sequence, kv head)
    s = tl.program_id(1)  # slice of the keys
    b = bh // kv_heads
    kvh = bh % kv_heads
    valid = tl.load(pos_ptr + b).to(tl.int32) + 1  # keys 0 .. position
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
    lo = s * keys_per_slice
    hi = tl.minimum(lo + keys_per_slice, valid)
    head = kvh.to(tl.int64) * stride_ch
    offs_l = tl.arange(0, BLOCK_L)
    for start in range(lo, hi, BLOCK_L):  # a tile is one block (BLOCK_L == block tokens; lo is block-aligned)
        block = tl.load(table_ptr + b * stride_tb + start // BLOCK_L).to(tl.int64)  # one lookup per block
        keys = start + offs_l
        k_mask = keys < hi
        ptrs = block * stride_cb + head + offs_l[:, None].to(tl.int64) * stride_cl + d[None, :]
        k = tl.load(kc_ptr + ptrs, mask=k_mask[:, None] & d_mask[None, :], other=0.0)  # (L, D)
        if FP8:  # float8 values times their per-position scale (applied to the scores and the weights)
            k = k.to(q.dtype)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        if FP8:
            sptrs = block * stride_sb + kvh.to(tl.int64) * stride_sh + offs_l
            scores = scores * tl.load(ks_ptr + sptrs, mask=k_mask, other=0.0)[None, :]
        scores = tl.where(k_mask[None, :], scores * sm_scale_log2, float("-inf"))  # (G, L), log2 units
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(vc_ptr + ptrs, mask=k_mask[:, None] & d_mask[None, :], other=0.0)  # (L, D)
        pv = p
        if FP8:
            v = v.to(q.dtype)
            pv = p * tl.load(vs_ptr + sptrs, mask=k_mask, other=0.0)[None, :]
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(pv, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(pv.to(v.dtype), v)
        m_i = m_new
    row = (b * kv_heads * groups + heads) * slices + s  # (sequence, query head, slice)
    tl.store(m_ptr + row, m_i, mask=g_mask)
    tl.store(l_ptr + row, l_i, mask=g_mask)
    tl.store(acc_ptr + row[:, None] * dim + d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, gate_ptr, out_ptr,
    heads, dim, slices, stride_gb, stride_gh,
    HAS_GATE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)  # (sequence, query head)
    b = row // heads
    h = row % heads
    s = tl.arange(0, BLOCK_S)
    s_mask = s < slices
    m = tl.load(m_ptr + row * slices + s, mask=s_mask, other=float("-inf"))
    m_max = tl.max(m, axis=0)
    w = tl.where(s_mask, tl.exp2(m - m_max), 0.0)  # empty slices (m = -inf) weigh 0
    l_sum = tl.sum(w * tl.load(l_ptr + row * slices + s, mask=s_mask, other=0.0), axis=0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < dim
    acc = tl.load(acc_ptr + (row * slices + s)[:, None] * dim + d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)  # (S, D)
    out = tl.sum(acc * w[:, None], axis=0) / l_sum
    if HAS_GATE:
        gate = tl.load(gate_ptr + b * stride_gb + h * stride_gh + d, mask=d_mask, other=0.0).to(tl.float32)
        out = out.to(out_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(gate)  # round as the torch path does
    tl.store(out_ptr + row * dim + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def slicing(kv_length: int) -> tuple[int, int]:
    """(keys per slice, slices) for an attended length: a pure function of it (see the module note)."""
    per = max(BLOCK_KEYS, triton.cdiv(triton.cdiv(kv_length, TARGET_SLICES), BLOCK_KEYS) * BLOCK_KEYS)
    return per, triton.cdiv(kv_length, per)


def decode_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                     positions: torch.Tensor, kv_length: int, gate: torch.Tensor | None = None,
                     scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Causal attention of one token per sequence: ``q`` ``(B, 1, H, D)`` (D contiguous) over the keys
    ``0 .. positions[b]`` of sequence ``b`` (``positions`` ``(B, 1)`` on the device; ``kv_length`` bounds
    them, as the mask of the reference path does) in the paged caches ``(blocks, kvH, block_tokens, D)``:
    key ``p`` in block ``block_table[b, p // block_tokens]`` (``(B, blocks per row)`` int32), offset
    ``p % block_tokens``; ``block_tokens`` a power of two in 16..BLOCK_KEYS. Scale ``1/sqrt(D)``. Returns
    ``(B, 1, H*D)`` in ``q``'s dtype, times ``sigmoid(gate)`` when ``gate`` ``(B, 1, H, D)`` (any
    batch/head strides) is given. With ``scales`` (float8 caches' key and value scales ``(blocks, kvH,
    block_tokens)`` float32) a key's score and a value's weight are multiplied by its position's scale."""
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
    per, slices = slicing(kv_length)
    dev = q.device
    m = torch.empty((batch, heads, slices), dtype=torch.float32, device=dev)
    l_sum = torch.empty_like(m)
    acc = torch.empty((batch, heads, slices, dim), dtype=torch.float32, device=dev)
    out = torch.empty((batch, 1, heads * dim), dtype=q.dtype, device=dev)
    pos = positions.reshape(-1)
    block_d = triton.next_power_of_2(dim)
    key_scale, value_scale = scales if scales is not None else (m, m)  # unused without fp8
    with launch_device(q):
        _split_kernel[(batch * kv_heads, slices)](
            q, key_cache, value_cache, block_table, pos, m, l_sum, acc, key_scale, value_scale,
            kv_heads, groups, dim, per, slices, 1.4426950408889634 / dim**0.5,
            q.stride(0), q.stride(2), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            block_table.stride(0), key_scale.stride(0) if scales is not None else 0,
            key_scale.stride(1) if scales is not None else 0,
            G_PAD=max(16, triton.next_power_of_2(groups)), BLOCK_D=block_d, BLOCK_L=block_tokens,
            IEEE=q.dtype == torch.float32, FP8=scales is not None, num_warps=4, num_stages=2, **dependent_launch(q),
        )
        if gate is not None and gate.stride(-1) != 1:
            gate = gate.contiguous()
        g = gate if gate is not None else out
        _combine_kernel[(batch * heads,)](
            m, l_sum, acc, g, out, heads, dim, slices, g.stride(0), g.stride(2) if gate is not None else 0,
            HAS_GATE=gate is not None, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(slices)), num_warps=2,
            **dependent_launch(q),
        )
    return out
