"""One KV-cache block of online-softmax attention: the step the decode split kernel and the prefill kernel share.

Both kernels walk a sequence's paged cache one block at a time (:mod:`stagewise.models.block_table`) and fold
each block into a running max, sum and weighted values in float32 (log2 units); they differ only in which
scores a block keeps (``keep``: the keys in the decode range, or the causal ones of each query row).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_kv_block(q, kc_ptr, vc_ptr, ks_ptr, vs_ptr, block, head, kvh, offs, d, d_mask, k_mask, keep, m_i, l_i,
                    acc, sm_scale_log2, stride_cb, stride_cl, stride_sb, stride_sh, IEEE: tl.constexpr,
                    FP8: tl.constexpr):  # type: ignore[no-untyped-def]
    """Fold cache block ``block`` (its positions ``offs``, those under ``k_mask`` read) of KV head ``kvh`` (``head``:
    its offset in the cache) into ``(m_i, l_i, acc)`` for queries ``q`` ``(R, D)``, scores outside ``keep``
    ``(R, L)`` dropped; returns the new ``(m_i, l_i, acc)``. With ``FP8`` the caches hold float8 values times the
    per-position scales in ``ks_ptr`` / ``vs_ptr`` (applied to the scores and the weights)."""
    ptrs = block * stride_cb + head + offs[:, None].to(tl.int64) * stride_cl + d[None, :]
    k = tl.load(kc_ptr + ptrs, mask=k_mask[:, None] & d_mask[None, :], other=0.0)  # (L, D)
    if FP8:
        k = k.to(q.dtype)
    if IEEE:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    if FP8:
        sptrs = block * stride_sb + kvh.to(tl.int64) * stride_sh + offs
        scores = scores * tl.load(ks_ptr + sptrs, mask=k_mask, other=0.0)[None, :]
    scores = tl.where(keep, scores * sm_scale_log2, float("-inf"))  # (R, L), log2 units
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
    return m_new, l_i, acc
