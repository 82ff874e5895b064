"""Rotary position embedding applied in one Triton launch (the reference path takes five).

``y = x * cos + rotate_half(x) * sin`` over the first ``rotary_dim`` channels of every head, the
rest copied through; computed in float32 with one rounding. Reads ``x`` as ``(B, T, H, D)`` with
arbitrary token/head strides (straight out of a fused q/k/v projection) and writes a contiguous
``(B, T, H, D)`` tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.triton_launch import launch_device


@triton.jit
def _rotary_kernel(
    x_ptr, cos_ptr, sin_ptr, y_ptr,
    heads, dim, rotary_dim,
    stride_xt, stride_xh,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)  # (token, head)
    t = row // heads
    h = row % heads
    c = tl.arange(0, BLOCK)
    mask = c < dim
    base = x_ptr + t * stride_xt + h * stride_xh
    x = tl.load(base + c, mask=mask, other=0.0).to(tl.float32)
    half = rotary_dim // 2
    rot = c < rotary_dim
    partner = tl.where(c < half, c + half, c - half)
    xp = tl.load(base + partner, mask=mask & rot, other=0.0).to(tl.float32)
    sign = tl.where(c < half, -1.0, 1.0)
    cos = tl.load(cos_ptr + t * rotary_dim + c, mask=mask & rot, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * rotary_dim + c, mask=mask & rot, other=0.0).to(tl.float32)
    y = tl.where(rot, x * cos + sign * xp * sin, x)
    tl.store(y_ptr + row * dim + c, y.to(y_ptr.dtype.element_ty), mask=mask)


def apply_rotary_bthd(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(B, T, H, D)`` (last dim contiguous) by ``cos``/``sin`` ``(B, T, rotary_dim)``.

    Returns a contiguous ``(B, T, H, D)`` tensor in ``x``'s dtype.
    """
    batch, steps, heads, dim = x.shape
    if x.stride(-1) != 1:
        raise ValueError("rotary needs the head dim contiguous")
    if x.stride(0) != steps * x.stride(1):
        x = x.contiguous()  # tokens of different rows not evenly spaced
    rotary_dim = cos.shape[-1]
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    with launch_device(x):
        _rotary_kernel[(batch * steps * heads,)](
            x, cos, sin, y, heads, dim, rotary_dim, x.stride(1), x.stride(2),
            BLOCK=triton.next_power_of_2(dim), num_warps=1 if dim <= 256 else 2,
        )
    return y
