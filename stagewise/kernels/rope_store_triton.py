"""An attention block's step between projection and attention in one Triton launch: the per-head
RMSNorm of q and k where the model has one (Qwen3), rotary position embedding of q and k, and the KV
cache write (the reference path: two norms, the cos/sin tables, seven launches, two rotations of five
operations each, and two cache copies).

The norm (:class:`QKNorm`) is computed as :func:`~stagewise.kernels.rms_norm_triton.rms_norm` computes
it — float32, ``x * rsqrt(mean(x²) + eps)``, rounded to the activation dtype before the weight (or
``(1 + w)`` in float32 for a zero-centred weight), the result rounded — and rotated from those rounded
values, so it differs from the two separate launches only in the float32 sum's order.

``y = x * cos + rotate_half(x) * sin`` over the first ``rotary_dim`` channels of every head, the
rest copied through. The angles are computed in the kernel as the reference computes its tables:
``float32(position) * inv_freq`` in float32, then ``cos``/``sin`` (on CUDA the same values as torch's
tables, bit for bit, which the kernel tests check), rounded to the activation dtype; the rotation
itself is float32 with one rounding. Reads q, k and v as ``(B, T, H, D)`` with arbitrary token/head
strides (straight out of a fused q/k/v projection); writes the rotated queries as a contiguous
``(B, T, H, D)`` tensor, the rotated keys and the values into the paged cache at each token's
position (through the block table: the slot mapping is one table load per key row). A float8 e4m3
cache (``scales`` given) stores each head's keys and values as the torch path does
(:func:`stagewise.models.kv_cache.fp8_quantize`): rounded to the activation dtype, divided by their
absolute maximum over 448 (IEEE division), with that scale in float32 beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import dependent_launch, launch_device, next_power_of_2


@dataclass(frozen=True)
class QKNorm:
    """The per-head RMSNorm of queries and keys (two norms built alike): weights ``(D,)``, their shared ``eps``,
    and whether the weights are stored as offsets from 1 (zero-centred)."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float
    zero_centered: bool = False


@triton.jit
def _normed(x, rstd, w, ZERO_CENTERED: tl.constexpr, dtype: tl.constexpr):
    """``x`` normalized as the RMSNorm kernel stores it (rounded to ``dtype``), back in float32."""
    h = x * rstd
    if ZERO_CENTERED:
        y = h * (1.0 + w)
    else:
        y = h.to(dtype).to(tl.float32) * w
    return y.to(dtype).to(tl.float32)


@triton.jit
def _head(base, w_ptr, c, partner, mask, rot, dim, eps, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr,
          dtype: tl.constexpr):
    """One head's channels and their rotation partners, float32, normalized first when ``NORM``."""
    x = tl.load(base + c, mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(base + partner, mask=mask & rot, other=0.0).to(tl.float32)
    if NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
        w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=mask & rot, other=0.0).to(tl.float32)
        x = _normed(x, rstd, w, ZERO_CENTERED, dtype)
        xp = _normed(xp, rstd, wp, ZERO_CENTERED, dtype)
    return x, xp


@triton.jit
def _fp8_store(x, mask, c_ptr, dst, s_ptr, sdst):
    """Row ``x`` (float32, already rounded to the activation dtype) as float8 values and one float32 scale."""
    amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0)
    scale = tl.maximum(tl.math.div_rn(amax, 448.0), 5.9604644775390625e-08)  # 2**-24: an all-zero row
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -448.0), 448.0)
    tl.store(c_ptr + dst, y.to(c_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + sdst, scale)


@triton.jit
def _rope_store_kernel(
    q_ptr, k_ptr, v_ptr, f_ptr, pos_ptr, qo_ptr, kc_ptr, vc_ptr, table_ptr, qw_ptr, kw_ptr, ks_ptr, vs_ptr,
    steps, heads, dim, rotary_dim, eps,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    stride_cb, stride_ch, stride_cl, stride_tb, stride_sb, stride_sh,
    NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, FP8: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_TOKENS: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)  # (sequence, token)
    h = tl.program_id(1)  # query heads first, then kv heads
    b = row // steps
    t = row % steps
    c = tl.arange(0, BLOCK)
    mask = c < dim
    half = rotary_dim // 2
    rot = c < rotary_dim
    partner = tl.where(c < half, c + half, c - half)
    sign = tl.where(c < half, -1.0, 1.0)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    inv_freq = tl.load(f_ptr + tl.where(c < half, c, c - half), mask=mask & rot, other=0.0)
    angle = pos.to(tl.float32) * inv_freq  # the table's float32 product, cat(freqs, freqs)
    cos = tl.where(rot, tl.cos(angle).to(qo_ptr.dtype.element_ty).to(tl.float32), 1.0)
    sin = tl.where(rot, tl.sin(angle).to(qo_ptr.dtype.element_ty).to(tl.float32), 0.0)
    dtype = qo_ptr.dtype.element_ty
    if h < heads:
        base = q_ptr + b * stride_qb + t * stride_qt + h * stride_qh
        x, xp = _head(base, qw_ptr, c, partner, mask, rot, dim, eps, NORM, ZERO_CENTERED, dtype)
        y = tl.where(rot, x * cos + sign * xp * sin, x)
        tl.store(qo_ptr + (row * heads + h) * dim + c, y.to(qo_ptr.dtype.element_ty), mask=mask)
    else:
        g = h - heads
        base = k_ptr + b * stride_kb + t * stride_kt + g * stride_kh
        x, xp = _head(base, kw_ptr, c, partner, mask, rot, dim, eps, NORM, ZERO_CENTERED, dtype)
        y = tl.where(rot, x * cos + sign * xp * sin, x)
        block = tl.load(table_ptr + b * stride_tb + pos // BLOCK_TOKENS).to(tl.int64)  # the slot mapping
        dst = block * stride_cb + g * stride_ch + (pos % BLOCK_TOKENS) * stride_cl + c
        v = tl.load(v_ptr + b * stride_vb + t * stride_vt + g * stride_vh + c, mask=mask, other=0.0)
        if FP8:
            sdst = block * stride_sb + g * stride_sh + pos % BLOCK_TOKENS
            _fp8_store(y.to(dtype).to(tl.float32), mask, kc_ptr, dst, ks_ptr, sdst)
            _fp8_store(v.to(tl.float32), mask, vc_ptr, dst, vs_ptr, sdst)
        else:
            tl.store(kc_ptr + dst, y.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def rope_store(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor,
               positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               block_table: torch.Tensor, norm: QKNorm | None = None,
               scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """With ``norm``, first normalize each head of ``q`` and ``k`` (module doc). Rotate ``q`` ``(B, T, H, D)``
    and ``k`` ``(B, T, kvH, D)`` at ``positions`` ``(B, T)`` (on the device) by the angles ``position *
    inv_freq`` (float32 ``(rotary_dim // 2,)``), with cos/sin rounded to ``q``'s dtype as the reference's
    tables are; write the rotated keys and ``v`` ``(B, T, kvH, D)``
    into the paged caches ``(blocks, kvH, block_tokens, D)`` at those positions: position ``p`` of
    sequence ``b`` in block ``block_table[b, p // block_tokens]`` (``block_table`` ``(B, blocks per row)``
    int32, the step's rows), offset ``p % block_tokens``. Any token/head strides, D contiguous. With
    ``scales`` (the key and value scales ``(blocks, kvH, block_tokens)`` float32 of float8 caches), each
    head's key and value row is stored scaled, its scale beside it (module doc).
    Returns the rotated queries, a contiguous ``(B, T, H, D)`` tensor."""
    batch, steps, heads, dim = q.shape
    kv_heads = k.shape[2]
    if (q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or key_cache.stride(-1) != 1
            or block_table.stride(-1) != 1):
        raise ValueError("rope_store needs the head dim contiguous")
    rotary_dim = 2 * inv_freq.shape[-1]
    if inv_freq.dtype != torch.float32 or not inv_freq.is_contiguous() or rotary_dim > dim:
        raise ValueError(f"rope_store needs contiguous float32 inverse frequencies for at most {dim} channels")
    pos = positions.reshape(-1)
    if not pos.is_contiguous():
        pos = pos.contiguous()
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if norm is not None and (norm.q_weight.shape != (dim,) or norm.k_weight.shape != (dim,)):
        raise ValueError(f"the q/k norm weights must have {dim} channels")
    q_weight = norm.q_weight if norm is not None else inv_freq  # unused without a norm
    k_weight = norm.k_weight if norm is not None else inv_freq
    key_scale, value_scale = scales if scales is not None else (inv_freq, inv_freq)  # unused without fp8
    if scales is not None and (key_scale.shape != key_cache.shape[:3] or key_scale.stride() != value_scale.stride()
                               or key_scale.stride(-1) != 1):
        raise ValueError("rope_store needs contiguous scales of the caches' (blocks, kvH, block_tokens)")
    with launch_device(q):
        _rope_store_kernel[(batch * steps, heads + kv_heads)](
            q, k, v, inv_freq, pos, out, key_cache, value_cache, block_table, q_weight, k_weight,
            key_scale, value_scale,
            steps, heads, dim, rotary_dim, norm.eps if norm is not None else 0.0,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            block_table.stride(0), key_scale.stride(0) if scales is not None else 0,
            key_scale.stride(1) if scales is not None else 0,
            NORM=norm is not None, ZERO_CENTERED=norm is not None and norm.zero_centered, FP8=scales is not None,
            BLOCK=next_power_of_2(dim), BLOCK_TOKENS=key_cache.shape[2], num_warps=1 if dim <= 256 else 2,
            **dependent_launch(q),
        )
    return out
