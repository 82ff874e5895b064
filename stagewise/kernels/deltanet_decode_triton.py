"""Gated DeltaNet's decode step (one token per sequence) as two Triton launches.

The reference path (``models/layers/gated_deltanet.py`` with ``delta_rule.recurrent_gated_delta_rule``)
spends ~45 launches per layer on a single token: the conv window shuffle, the gates, repeating
q/k heads, casts, two L2 norms and the rank-1 state update. Here:

- :func:`conv_step`: shift the conv window by the new input, depthwise conv over the kernel, SiLU;
  writes the new window and the mixed q/k/v row.
- :func:`delta_step`: the gates (``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``),
  L2-normalized and scaled q/k, decay, delta-rule write and readout, over a float32 state tile;
  writes the new state.

States live in pools of entries (``(E, ...)``): row ``b`` reads entry ``read[b]`` and writes entry
``write[b]`` (``(B,)`` int32 on the device, strided views allowed: CUDA graphs replay with whatever
the buffers hold), or,
given ints, the consecutive entries ``read + b`` and ``write + b`` (the double-buffered rows of
``RecurrentState`` viewed as a pool). A row never reads the entry it writes.

Both compute in float32 and round where the reference's stored tensors are rounded (``beta`` and
the conv output are activation-dtype tensors there), so they match it to float32 summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2


@triton.jit
def _conv_step_kernel(
    state_ptr, read_ptr, x_ptr, w_ptr, new_state_ptr, write_ptr, y_ptr,
    channels, stride_se, stride_xb, stride_ne, stride_yb, stride_r, stride_w,
    KERNEL: tl.constexpr, BLOCK_C: tl.constexpr, INDEXED: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    b = tl.program_id(0)
    if INDEXED:
        src = tl.load(read_ptr + b * stride_r).to(tl.int64)
        dst = tl.load(write_ptr + b * stride_w).to(tl.int64)
    else:
        src = b.to(tl.int64)
        dst = b.to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = c < channels
    x_new = tl.load(x_ptr + b * stride_xb + c, mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for j in tl.static_range(KERNEL):  # window = state[..., 1:] then the new input
        if j < KERNEL - 1:
            v = tl.load(state_ptr + src * stride_se + c * KERNEL + (j + 1), mask=mask, other=0.0)
        else:
            v = x_new.to(new_state_ptr.dtype.element_ty)
        tl.store(new_state_ptr + dst * stride_ne + c * KERNEL + j, v, mask=mask)
        w = tl.load(w_ptr + c * KERNEL + j, mask=mask, other=0.0)
        acc += v.to(w_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)  # the reference's conv output is rounded
    silu = (acc * tl.sigmoid(acc)).to(w_ptr.dtype.element_ty)
    tl.store(y_ptr + b * stride_yb + c, silu.to(y_ptr.dtype.element_ty), mask=mask)


def _entries(pool: torch.Tensor, index: torch.Tensor | int, rows: int) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """The kernel's view of ``pool``, its index tensor and that tensor's stride for ``index`` (module
    docstring): a tensor of entries as it is (a strided view, e.g. a column of a ``[read, write]``
    table, is fine), or an int as the pool from that entry on (the kernel then takes entry ``b``)."""
    if isinstance(index, int):
        if not 0 <= index <= pool.shape[0] - rows:
            raise ValueError(f"entries {index}..{index + rows - 1} outside a pool of {pool.shape[0]}")
        return pool[index:], pool, 0, False
    if index.shape != (rows,) or index.dtype != torch.int32:
        raise ValueError(f"expected ({rows},) int32 entries, got {index.dtype} {tuple(index.shape)}")
    return pool, index, index.stride(0), True


def conv_step(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, read: torch.Tensor | int,
              write: torch.Tensor | int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token through the depthwise causal conv + SiLU.

    Args:
        x: the new input ``(B, C)`` (last dim contiguous); weight: ``(C, 1, K)``;
        conv_pool: windows ``(E, C, K)``, row-major per entry; row ``b`` reads window ``read[b]`` and
            writes the shifted one to ``write[b]`` (``(B,)`` int32, or ints: entries ``read + b``, ``write + b``).
        out: ``(B, C)`` for the result (allocated when None), last dim contiguous.
    Returns:
        ``silu(conv(window))`` ``(B, C)`` in ``x``'s dtype (``out``).
    """
    batch, channels = x.shape
    kernel = conv_pool.shape[-1]
    w = weight.reshape(channels, kernel).contiguous()
    if conv_pool.stride(-1) != 1 or conv_pool.stride(-2) != kernel or x.stride(-1) != 1:
        raise ValueError("conv_step needs row-major windows and a contiguous input row")
    source, read_index, stride_r, indexed = _entries(conv_pool, read, batch)
    target, write_index, stride_w, write_indexed = _entries(conv_pool, write, batch)
    if indexed != write_indexed:
        raise ValueError("conv_step takes read and write entries both as tensors or both as ints")
    y = out if out is not None else torch.empty((batch, channels), dtype=x.dtype, device=x.device)
    if y.shape != (batch, channels) or y.stride(-1) != 1:
        raise ValueError(f"conv_step: out {tuple(y.shape)} is not ({batch}, {channels}) with contiguous rows")
    block = 256
    with launch_device(x):
        _conv_step_kernel[(batch, cdiv(channels, block))](
            source, read_index, x, w, target, write_index, y, channels,
            conv_pool.stride(0), x.stride(0), conv_pool.stride(0), y.stride(0), stride_r, stride_w,
            KERNEL=kernel, BLOCK_C=block, INDEXED=indexed, num_warps=4, **dependent_launch(x),
        )
    return y


@triton.jit
def _delta_step_kernel(
    mixed_ptr, b_ptr, a_ptr, alog_ptr, dtb_ptr, s_ptr, read_ptr, ns_ptr, write_ptr, o_ptr,
    v_heads, group, key_dim, dk, dv, scale,
    stride_mb, stride_bb, stride_ab, stride_se, stride_ne, stride_ob, stride_r, stride_w,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, INDEXED: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    pid = tl.program_id(0)  # (batch, value head)
    bi = pid // v_heads
    h = pid % v_heads
    if INDEXED:
        src = tl.load(read_ptr + bi * stride_r).to(tl.int64)
        dst = tl.load(write_ptr + bi * stride_w).to(tl.int64)
    else:
        src = bi.to(tl.int64)
        dst = bi.to(tl.int64)
    kh = h // group  # the key head this value head reads
    vs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < dk
    vmask = vs < dv
    row = mixed_ptr + bi * stride_mb
    q = tl.load(row + kh * dk + ks, mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(row + key_dim + kh * dk + ks, mask=kmask, other=0.0).to(tl.float32)
    v = tl.load(row + 2 * key_dim + h * dv + vs, mask=vmask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    b = tl.load(b_ptr + bi * stride_bb + h).to(tl.float32)
    beta = tl.sigmoid(b).to(b_ptr.dtype.element_ty).to(tl.float32)  # the reference keeps beta in the activation dtype
    a = tl.load(a_ptr + bi * stride_ab + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32)
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
    g = -tl.exp(tl.load(alog_ptr + h).to(tl.float32)) * softplus
    tile = (ks[:, None] * dv + vs[None, :])
    tmask = kmask[:, None] & vmask[None, :]
    s = tl.load(s_ptr + src * stride_se + h * dk * dv + tile, mask=tmask, other=0.0)  # (BK, BV) float32
    s = s * tl.exp(g)
    memory = tl.sum(s * k[:, None], axis=0)  # (BV,) what the state predicts for k
    delta = (v - memory) * beta
    s = s + k[:, None] * delta[None, :]
    out = tl.sum(s * q[:, None], axis=0)
    tl.store(ns_ptr + dst * stride_ne + h * dk * dv + tile, s, mask=tmask)
    tl.store(o_ptr + bi * stride_ob + h * dv + vs, out.to(o_ptr.dtype.element_ty), mask=vmask)


def delta_step(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
               pool: torch.Tensor, read: torch.Tensor | int, write: torch.Tensor | int, k_heads: int, k_dim: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """One token of the gated delta rule for every (sequence, value head).

    Args:
        mixed: ``(B, 2 * Hk * Dk + Hv * Dv)`` the conv output row: q, k, v (last dim contiguous).
        b, a: ``(B, Hv)`` write-strength and decay inputs; a_log, dt_bias: ``(Hv,)``.
        pool: states ``(E, Hv, Dk, Dv)`` float32, each entry contiguous; row ``b`` reads entry
            ``read[b]`` and writes its new state to ``write[b]`` (``(B,)`` int32, or ints: entries
            ``read + b``, ``write + b``).
        out: ``(B, Hv, Dv)`` for the readout (allocated when None), contiguous.
    Returns:
        ``(B, Hv, Dv)`` readout in ``mixed``'s dtype (``out``).
    """
    batch = mixed.shape[0]
    v_heads, dk, dv = pool.shape[1:]
    if dk != k_dim or pool.stride(-1) != 1 or pool.stride(-2) != dv or pool.stride(-3) != dk * dv:
        raise ValueError("delta_step needs a pool of contiguous (Hv, Dk, Dv) entries")
    if b.stride(-1) != 1 or a.stride(-1) != 1 or mixed.stride(-1) != 1:
        raise ValueError("delta_step needs contiguous head dims")
    source, read_index, stride_r, indexed = _entries(pool, read, batch)
    target, write_index, stride_w, write_indexed = _entries(pool, write, batch)
    if indexed != write_indexed:
        raise ValueError("delta_step takes read and write entries both as tensors or both as ints")
    y = out if out is not None else torch.empty((batch, v_heads, dv), dtype=mixed.dtype, device=mixed.device)
    if y.shape != (batch, v_heads, dv) or y.stride()[1:] != (dv, 1):
        raise ValueError(f"delta_step: out {tuple(y.shape)} is not ({batch}, {v_heads}, {dv}) with contiguous heads")
    block_v = min(32, next_power_of_2(dv))
    with launch_device(mixed):
        _delta_step_kernel[(batch * v_heads, cdiv(dv, block_v))](
            mixed, b, a, a_log, dt_bias, source, read_index, target, write_index, y,
            v_heads, v_heads // k_heads, k_heads * k_dim, dk, dv, dk**-0.5,
            mixed.stride(0), b.stride(0), a.stride(0), pool.stride(0), pool.stride(0), y.stride(0), stride_r, stride_w,
            BLOCK_K=next_power_of_2(dk), BLOCK_V=block_v, INDEXED=indexed, num_warps=4,
            **dependent_launch(mixed),
        )
    return y
