"""Gated DeltaNet's decode step (one token per sequence) as two Triton launches.

The reference path (``models/layers/gated_deltanet.py`` with ``delta_rule.recurrent_gated_delta_rule``)
spends ~45 launches per layer on a single token: the conv window shuffle, the gates, repeating
q/k heads, casts, two L2 norms and the rank-1 state update. Here:

- :func:`conv_step`: shift the conv window by the new input, depthwise conv over the kernel, SiLU;
  writes the new window into the provisional state buffer and the mixed q/k/v row.
- :func:`delta_step`: the gates (``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``),
  L2-normalized and scaled q/k, decay, delta-rule write and readout, over a float32 state tile;
  writes the new state into the provisional buffer (the published one is only read).

Both compute in float32 and round where the reference's stored tensors are rounded (``beta`` and
the conv output are activation-dtype tensors there), so they match it to float32 summation order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import dependent_launch, launch_device


@triton.jit
def _conv_step_kernel(
    state_ptr, x_ptr, w_ptr, new_state_ptr, y_ptr,
    channels, stride_sb, stride_xb, stride_nb, stride_yb,
    KERNEL: tl.constexpr, BLOCK_C: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = c < channels
    x_new = tl.load(x_ptr + b * stride_xb + c, mask=mask, other=0.0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for j in tl.static_range(KERNEL):  # window = state[..., 1:] then the new input
        if j < KERNEL - 1:
            v = tl.load(state_ptr + b * stride_sb + c * KERNEL + (j + 1), mask=mask, other=0.0)
        else:
            v = x_new
        tl.store(new_state_ptr + b * stride_nb + c * KERNEL + j, v, mask=mask)
        w = tl.load(w_ptr + c * KERNEL + j, mask=mask, other=0.0).to(tl.float32)
        acc += v.to(tl.float32) * w
    acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32)  # the reference's conv output is rounded
    tl.store(y_ptr + b * stride_yb + c, (acc * tl.sigmoid(acc)).to(y_ptr.dtype.element_ty), mask=mask)


def conv_step(state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, new_state: torch.Tensor) -> torch.Tensor:
    """One token through the depthwise causal conv + SiLU.

    Args:
        state: published window ``(B, C, K)``; x: the new input ``(B, C)`` (last dim contiguous);
        weight: ``(C, 1, K)``; new_state: provisional window ``(B, C, K)``, written.
    Returns:
        ``silu(conv(window))`` ``(B, C)`` in ``x``'s dtype.
    """
    batch, channels, kernel = state.shape
    w = weight.reshape(channels, kernel).contiguous()
    if state.stride(-1) != 1 or state.stride(-2) != kernel or new_state.stride(-2) != kernel or x.stride(-1) != 1:
        raise ValueError("conv_step needs row-major windows and a contiguous input row")
    y = torch.empty((batch, channels), dtype=x.dtype, device=x.device)
    block = 256
    with launch_device(x):
        _conv_step_kernel[(batch, triton.cdiv(channels, block))](
            state, x, w, new_state, y, channels, state.stride(0), x.stride(0), new_state.stride(0), y.stride(0),
            KERNEL=kernel, BLOCK_C=block, num_warps=4, **dependent_launch(x),
        )
    return y


@triton.jit
def _delta_step_kernel(
    mixed_ptr, b_ptr, a_ptr, alog_ptr, dtb_ptr, s_ptr, ns_ptr, o_ptr,
    v_heads, group, key_dim, dk, dv, scale,
    stride_mb, stride_bb, stride_ab, stride_sb, stride_nb, stride_ob,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    pid = tl.program_id(0)  # (batch, value head)
    bi = pid // v_heads
    h = pid % v_heads
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
    s = tl.load(s_ptr + bi * stride_sb + h * dk * dv + tile, mask=tmask, other=0.0)  # (BK, BV) float32
    s = s * tl.exp(g)
    memory = tl.sum(s * k[:, None], axis=0)  # (BV,) what the state predicts for k
    delta = (v - memory) * beta
    s = s + k[:, None] * delta[None, :]
    out = tl.sum(s * q[:, None], axis=0)
    tl.store(ns_ptr + bi * stride_nb + h * dk * dv + tile, s, mask=tmask)
    tl.store(o_ptr + bi * stride_ob + h * dv + vs, out.to(o_ptr.dtype.element_ty), mask=vmask)


def delta_step(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
               state: torch.Tensor, new_state: torch.Tensor, k_heads: int, k_dim: int) -> torch.Tensor:
    """One token of the gated delta rule for every (sequence, value head).

    Args:
        mixed: ``(B, 2 * Hk * Dk + Hv * Dv)`` the conv output row: q, k, v (last dim contiguous).
        b, a: ``(B, Hv)`` write-strength and decay inputs; a_log, dt_bias: ``(Hv,)``.
        state: published ``(B, Hv, Dk, Dv)`` float32; new_state: provisional, same shape, written.
    Returns:
        ``(B, Hv, Dv)`` readout in ``mixed``'s dtype.
    """
    batch, v_heads, dk, dv = state.shape
    if dk != k_dim or not (state.is_contiguous() and new_state.is_contiguous()):
        raise ValueError("delta_step needs contiguous (B, Hv, Dk, Dv) states")
    if b.stride(-1) != 1 or a.stride(-1) != 1 or mixed.stride(-1) != 1:
        raise ValueError("delta_step needs contiguous head dims")
    out = torch.empty((batch, v_heads, dv), dtype=mixed.dtype, device=mixed.device)
    block_v = min(32, triton.next_power_of_2(dv))
    with launch_device(mixed):
        _delta_step_kernel[(batch * v_heads, triton.cdiv(dv, block_v))](
            mixed, b, a, a_log, dt_bias, state, new_state, out,
            v_heads, v_heads // k_heads, k_heads * k_dim, dk, dv, dk**-0.5,
            mixed.stride(0), b.stride(0), a.stride(0), state.stride(0), new_state.stride(0), out.stride(0),
            BLOCK_K=triton.next_power_of_2(dk), BLOCK_V=block_v, num_warps=4, **dependent_launch(mixed),
        )
    return out
