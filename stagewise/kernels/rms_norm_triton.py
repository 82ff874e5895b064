"""Fused RMSNorm (and its gated variant) as one Triton kernel per call.

The reference path (``models/layers/rms_norm.py``) is 7 launches (cast, square, mean, add, rsqrt,
multiply, weight); the gated norm of Gated DeltaNet adds SiLU and a multiply. Here one program
normalizes one row in float32 and rounds where the reference rounds (the plain norm casts the
normalized row to the activation dtype before the weight multiply), so results match the
reference to within float32 reduction order.

:func:`add_rms_norm` also folds in the residual add before the norm: it stores the rounded sum and
normalizes it, as the reference does with two launches.

Rows are addressed through two strides, so a per-head norm can read ``q`` straight out of a
fused projection's output (``(B, T, H, D)`` views with a gap between tokens) without a copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import dependent_launch, launch_device, next_power_of_2

PLAIN, ZERO_CENTERED, GATED = 0, 1, 2  # weight modes


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, z_ptr, y_ptr,
    inner, dim, eps,
    stride_xo, stride_xi, stride_zo, stride_zi,
    MODE: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)
    outer = row // inner
    i = row % inner
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + outer * stride_xo + i * stride_xi + cols, mask=mask, other=0.0).to(tl.float32)
    h = x * tl.rsqrt(tl.sum(x * x, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if MODE == 1:  # zero-centred: (h * (1 + w)) in float32, one rounding
        y = h * (1.0 + w)
    else:  # w * h.to(dtype): round h first, as the reference does
        y = h.to(y_ptr.dtype.element_ty).to(tl.float32) * w
        if MODE == 2:  # gated: (round(w * h) * silu(z)) in float32
            z = tl.load(z_ptr + outer * stride_zo + i * stride_zi + cols, mask=mask, other=0.0).to(tl.float32)
            y = y.to(y_ptr.dtype.element_ty).to(tl.float32) * (z * tl.sigmoid(z))
    tl.store(y_ptr + row * dim + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> tuple[int, int, int, int]:
    """(outer, inner, stride_outer, stride_inner) addressing every row of ``x``'s last dim."""
    if x.stride(-1) != 1:
        raise ValueError("the normalized dim must be contiguous")
    if x.dim() == 1:
        return 1, 1, 0, 0
    if x.dim() == 2:
        return x.shape[0], 1, x.stride(0), 0
    lead = x.flatten(0, -3)  # (outer, inner, D): a view when the leading dims are mergeable
    return lead.shape[0], lead.shape[1], lead.stride(0), lead.stride(1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered: bool = False,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over ``x``'s last dim, one launch. Returns a contiguous tensor of ``x``'s shape and dtype.

    ``zero_centered``: the weight is stored as an offset, ``(1 + w)``. ``gate`` (same shape as
    ``x``): the gated norm ``round(w * round(norm(x))) * silu(gate)``.
    """
    dim = x.shape[-1]
    outer, inner, so, si = _rows(x)
    mode = GATED if gate is not None else (ZERO_CENTERED if zero_centered else PLAIN)
    zo, zi = (0, 0)
    if gate is not None:
        _, _, zo, zi = _rows(gate)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    with launch_device(x):
        _rms_norm_kernel[(outer * inner,)](
            x, weight, gate if gate is not None else x, y, inner, dim, eps, so, si, zo, zi,
            MODE=mode, BLOCK=next_power_of_2(dim), num_warps=4 if dim <= 2048 else 8, **dependent_launch(x),
        )
    return y


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, y_ptr, dim, eps, ZERO_CENTERED: tl.constexpr,
                         BLOCK: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * dim + cols, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(sum_ptr.dtype.element_ty)  # the residual stream, rounded as the reference stores it
    tl.store(sum_ptr + row * dim + cols, total, mask=mask)
    h = total.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        y = h * (1.0 + w)
    else:
        y = h.to(y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(y_ptr + row * dim + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + residual, rms_norm(x + residual))`` in one launch; both contiguous, ``x``'s shape and dtype."""
    dim = x.shape[-1]
    x, residual = x.contiguous(), residual.contiguous()
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    with launch_device(x):
        _add_rms_norm_kernel[(x.numel() // dim,)](
            x, residual, weight, total, y, dim, eps, ZERO_CENTERED=zero_centered,
            BLOCK=next_power_of_2(dim), num_warps=4 if dim <= 2048 else 8, **dependent_launch(x),
        )
    return total, y
