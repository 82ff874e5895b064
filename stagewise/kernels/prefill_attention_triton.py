"""Prefill attention over the paged KV cache in Triton: every prompt chunk of a step in one launch.

Replaces, for the chunks of prompt tokens a step carries (a rectangle step's rows, a packed step's
prompt segments), a gather of each row's keys and values into a dense copy followed by SDPA with
an explicit causal mask. On an H200 PyTorch runs that SDPA on cuDNN, which builds an execution plan
for every attended length it has not seen: about 1.7 ms of host time per call, one call per
attention block and segment, so a 512-token packed step of an 8B model at a 4,200-token context
took 35-200 ms instead of ~16 (bench/results/prefill_attention_h200).

Each program takes ``BLOCK_M`` consecutive tokens of one segment and one KV head: the ``G`` query
heads that share it, times the tokens, are the rows of one ``tl.dot`` (grouped-query attention
without repeating keys). It walks the row's blocks from position 0 up to the largest position among
its tokens (one block-table load per block of ``BLOCK_N == block_tokens`` keys), keeping a running
max and sum in float32 (FlashAttention's online softmax), and masks each key past its token's
position. Nothing about the walk depends on where a chunk starts or how tokens are grouped: a key
block that lies past a token's position adds exactly zero to it, so a token's result is the same
whatever chunk or program it lands in (a prompt served from the prefix cache, a staged run and a
single-device run agree bit for bit). Positions come from the device, so a captured graph stays
valid as they advance; the grid depends only on the step's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.kv_block_attention_triton import attend_kv_block
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2

TILE_ROWS = 128  # query rows (G heads x tokens) per program; 64 when D > 128 (the accumulator's registers)


@triton.jit
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, table_ptr, pos_ptr, seg_ptr, row_ptr, out_ptr, ks_ptr, vs_ptr, gate_ptr,
    groups, dim, sm_scale_log2,
    stride_qn, stride_qh, stride_cb, stride_ch, stride_cl, stride_tb, stride_on, stride_oh, stride_sb, stride_sh,
    stride_gn, stride_gh,
    BLOCK_M: tl.constexpr, G_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr, FP8: tl.constexpr, GATE: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    s = tl.program_id(0)  # segment
    first = tl.load(seg_ptr + s) + tl.program_id(1) * BLOCK_M  # this program's first token
    end = tl.load(seg_ptr + s + 1)
    kvh = tl.program_id(2)
    row = tl.load(row_ptr + s).to(tl.int64)  # the segment's block-table row
    r = tl.arange(0, G_PAD * BLOCK_M)
    g = r // BLOCK_M
    tok = first + r % BLOCK_M
    valid = (tok < end) & (g < groups)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < dim
    heads = kvh * groups + g
    tok64 = tok.to(tl.int64)
    q = tl.load(q_ptr + tok64[:, None] * stride_qn + heads[:, None] * stride_qh + d[None, :],
                mask=valid[:, None] & d_mask[None, :], other=0.0)  # (R, D)
    pos = tl.load(pos_ptr + tok, mask=valid, other=0).to(tl.int32)  # idle rows attend key 0: never stored
    kv_len = tl.max(pos, axis=0) + 1
    m_i = tl.full((G_PAD * BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((G_PAD * BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((G_PAD * BLOCK_M, BLOCK_D), dtype=tl.float32)
    head = kvh.to(tl.int64) * stride_ch
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, kv_len, BLOCK_N):  # one block of the row per iteration
        block = tl.load(table_ptr + row * stride_tb + start // BLOCK_N).to(tl.int64)
        keys = start + offs_n
        k_mask = keys < kv_len  # past every token of the program: not read (stale values of another row)
        causal = keys[None, :] <= pos[:, None]  # finite max: key 0 is every row's first key
        m_i, l_i, acc = attend_kv_block(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, block, head, kvh, offs_n, d, d_mask, k_mask,
                                        causal, m_i, l_i, acc, sm_scale_log2, stride_cb, stride_cl, stride_sb,
                                        stride_sh, IEEE, FP8)
    out = acc / l_i[:, None]
    if GATE:  # times sigmoid(gate), the output rounded first as the decode kernel and the torch path round it
        gate = tl.load(gate_ptr + tok64[:, None] * stride_gn + heads[:, None] * stride_gh + d[None, :],
                       mask=valid[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
        out = out.to(out_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(gate)
    tl.store(out_ptr + tok64[:, None] * stride_on + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=valid[:, None] & d_mask[None, :])


def prefill_attention(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                      positions: torch.Tensor, segments: torch.Tensor, rows: torch.Tensor, longest: int,
                      out: torch.Tensor | None = None,
                      scales: tuple[torch.Tensor, torch.Tensor] | None = None,
                      gate: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of the step's prompt tokens over their rows' paged caches.

    ``q`` ``(N, H, D)`` (D contiguous): the step's tokens; ``positions`` ``(N,)`` each token's
    position (on the device); ``segments`` ``(S + 1,)`` int32 token offsets: segment ``s`` is tokens
    ``segments[s] .. segments[s+1] - 1``, all of block-table row ``rows[s]`` (``(S,)`` int32), and each
    attends keys ``0 .. its position`` of that row, which must be in the caches already (written by
    :func:`~stagewise.kernels.rope_store_triton.rope_store`). ``longest``: at least the longest
    segment's tokens (sizes the grid). Caches ``(blocks, kvH, block_tokens, D)``, key ``p`` of row
    ``r`` in block ``block_table[r, p // block_tokens]``. Scale ``1/sqrt(D)``. Writes the segments'
    tokens of ``out`` (``(N, H, D)`` in ``q``'s dtype, allocated when None; tokens outside every
    segment are left as they are) and returns it. With ``scales`` (float8 caches' key and value scales
    ``(blocks, kvH, block_tokens)`` float32) a key's score and a value's weight are multiplied by its
    position's scale. With ``gate`` ``(N, H, D)`` (D contiguous; the output gate of Qwen3.5 / 3.6) each
    output is multiplied by ``sigmoid(gate)`` before it is stored."""
    _, heads, dim = q.shape
    kv_heads, block_tokens = key_cache.shape[1], key_cache.shape[2]
    if block_tokens < 16 or block_tokens & (block_tokens - 1) or block_table.stride(-1) != 1:
        raise ValueError(f"prefill_attention needs blocks of a power of two >= 16 positions and a row-contiguous "
                         f"block table, got {block_tokens}")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} kv heads evenly")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)
    groups = heads // kv_heads
    g_pad = next_power_of_2(groups)
    block_d = next_power_of_2(dim)
    tile = TILE_ROWS if block_d <= 128 else TILE_ROWS // 2
    block_m = max(16, tile // g_pad)
    grid = (int(rows.shape[0]), cdiv(max(longest, 1), block_m), kv_heads)
    key_scale, value_scale = scales if scales is not None else (out, out)  # unused without fp8
    if gate is not None and gate.stride(-1) != 1:
        raise ValueError("prefill_attention needs the gate's head dim contiguous")
    g = gate if gate is not None else out  # unused without a gate
    with launch_device(q):
        _prefill_kernel[grid](
            q, key_cache, value_cache, block_table, positions, segments, rows, out, key_scale, value_scale, g,
            groups, dim, 1.4426950408889634 / dim**0.5,
            q.stride(0), q.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            block_table.stride(0), out.stride(0), out.stride(1),
            key_scale.stride(0) if scales is not None else 0, key_scale.stride(1) if scales is not None else 0,
            g.stride(0), g.stride(1),
            BLOCK_M=block_m, G_PAD=g_pad, BLOCK_D=block_d, BLOCK_N=block_tokens,
            IEEE=q.dtype == torch.float32, FP8=scales is not None, GATE=gate is not None,
            num_warps=8 if block_d >= 128 else 4, num_stages=2,
            **dependent_launch(q),
        )
    return out
