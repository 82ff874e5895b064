"""MoE routing in two Triton launches: pick each token's experts, then combine their outputs.

- :func:`route`: softmax over the router logits (float32), top-k by repeated argmax, optional
  renormalization of the k weights; replaces softmax, topk, sum, divide and the casts.
- :func:`combine`: ``out[n] = sum_k w[n, k] * y[n * K + k]`` in float32, one rounding; replaces
  the multiply, sum and cast of the reference path; with a shared expert, then what
  :func:`add_gated_shared` computes, in the same launch;
- :func:`add_gated_shared`: ``out + sigmoid(g) * shared`` (the shared expert of Qwen3-Next /
  Qwen3.5-MoE), one launch for the reference's three.
The reference path (``models/layers/moe.py``, ``experts.py``) computes the same functions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2


@triton.jit
def _route_kernel(logits_ptr, index_ptr, weight_ptr, experts, stride_l,
                  TOP_K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)
    n = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    mask = e < experts
    logits = tl.load(logits_ptr + n * stride_l + e, mask=mask, other=-float("inf")).to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    total = 1.0
    if NORMALIZE:  # first pass: the sum of the k largest
        total = 0.0
        remaining = probs
        for _k in tl.static_range(TOP_K):
            best = tl.argmax(remaining, axis=0)
            total += tl.max(remaining, axis=0)
            remaining = tl.where(e == best, -1.0, remaining)
    remaining = probs
    for k in tl.static_range(TOP_K):  # k-th largest: argmax, then masked out
        best = tl.argmax(remaining, axis=0)
        tl.store(index_ptr + n * TOP_K + k, best.to(tl.int32))
        tl.store(weight_ptr + n * TOP_K + k, (tl.max(remaining, axis=0) / total).to(weight_ptr.dtype.element_ty))
        remaining = tl.where(e == best, -1.0, remaining)


def route(logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits ``(N, E)`` -> expert indices ``(N, K)`` int32 and weights ``(N, K)`` in the logits' dtype."""
    tokens, experts = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    index = torch.empty((tokens, top_k), dtype=torch.int32, device=logits.device)
    weight = torch.empty((tokens, top_k), dtype=logits.dtype, device=logits.device)
    with launch_device(logits):
        _route_kernel[(tokens,)](logits, index, weight, experts, logits.stride(0), TOP_K=top_k, NORMALIZE=normalize,
                                 BLOCK_E=next_power_of_2(experts), num_warps=4, **dependent_launch(logits))
    return index, weight


@triton.jit
def _combine_kernel(y_ptr, w_ptr, r_ptr, shared_ptr, gate_ptr, out_ptr, hidden, stride_g, TOP_K: tl.constexpr,
                    RESIDUAL: tl.constexpr, SHARED: tl.constexpr, BLOCK_H: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < hidden
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        w = tl.load(w_ptr + n * TOP_K + k).to(tl.float32)
        acc += w * tl.load(y_ptr + (n * TOP_K + k) * hidden + h, mask=mask, other=0.0).to(tl.float32)
    out = acc.to(out_ptr.dtype.element_ty)
    if SHARED:  # rounded, then as _gated_add_kernel: out + sigmoid(g) * shared, rounded once
        g = tl.sigmoid(tl.load(gate_ptr + n * stride_g).to(tl.float32))
        shared = tl.load(shared_ptr + n * hidden + h, mask=mask, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + g * shared).to(out_ptr.dtype.element_ty)
    if RESIDUAL:  # rounded, then added in float32 and rounded again: exactly ``out + residual``
        r = tl.load(r_ptr + n * hidden + h, mask=mask, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + r).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + n * hidden + h, out, mask=mask)


def _residual_rows(residual: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``residual`` as contiguous ``(N, H)`` rows matching ``like`` (``like`` itself where there is none)."""
    if residual is None:
        return like
    if residual.numel() != like.numel():
        raise ValueError(f"residual {tuple(residual.shape)} does not match the output {tuple(like.shape)}")
    return residual.reshape(like.shape).contiguous()


def combine(y: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, residual: torch.Tensor | None = None,
            shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Per-slot expert outputs ``y`` ``(N*K, H)`` and weights ``(N, K)`` -> ``(N, H)`` in ``dtype``; with
    ``shared`` (the shared expert's output ``(N, H)`` and gate logit ``(N, 1)``), then ``+ sigmoid(g) * shared``
    as :func:`add_gated_shared` rounds it; plus ``residual`` (``N x H`` elements) when given, with the
    rounding of a separate add. One launch."""
    tokens, top_k = weight.shape
    hidden = y.shape[-1]
    y, weight = y.contiguous(), weight.contiguous()
    out = torch.empty((tokens, hidden), dtype=dtype, device=y.device)
    r = _residual_rows(residual, out)
    shared_out, gate_logit = (shared[0].contiguous(), shared[1]) if shared is not None else (out, weight)
    if shared is not None and (shared_out.shape != out.shape or gate_logit.shape != (tokens, 1)):
        raise ValueError(f"a shared expert's output {tuple(shared_out.shape)} and gate {tuple(gate_logit.shape)} "
                         f"do not match {tokens} tokens of {hidden} features")
    block = min(1024, next_power_of_2(hidden))
    with launch_device(y):
        _combine_kernel[(tokens, cdiv(hidden, block))](y, weight, r, shared_out, gate_logit, out, hidden,
                                                       gate_logit.stride(0), TOP_K=top_k,
                                                       RESIDUAL=residual is not None, SHARED=shared is not None,
                                                       BLOCK_H=block, num_warps=4, **dependent_launch(y))
    return out


@triton.jit
def _gated_add_kernel(out_ptr, shared_ptr, gate_ptr, r_ptr, y_ptr, hidden, stride_g, RESIDUAL: tl.constexpr,
                      BLOCK_H: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)
    n = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < hidden
    g = tl.sigmoid(tl.load(gate_ptr + n * stride_g).to(tl.float32))
    out = tl.load(out_ptr + n * hidden + h, mask=mask, other=0.0).to(tl.float32)
    shared = tl.load(shared_ptr + n * hidden + h, mask=mask, other=0.0).to(tl.float32)
    y = (out + g * shared).to(y_ptr.dtype.element_ty)
    if RESIDUAL:  # as a separate add would round
        y = (y.to(tl.float32) + tl.load(r_ptr + n * hidden + h, mask=mask, other=0.0).to(tl.float32)).to(
            y_ptr.dtype.element_ty)
    tl.store(y_ptr + n * hidden + h, y, mask=mask)


def add_gated_shared(out: torch.Tensor, shared: torch.Tensor, gate_logit: torch.Tensor,
                     residual: torch.Tensor | None = None) -> torch.Tensor:
    """``out + sigmoid(gate_logit) * shared`` for ``out``, ``shared`` ``(N, H)`` and ``gate_logit`` ``(N, 1)``;
    plus ``residual`` (``N x H`` elements) when given, with the rounding of a separate add."""
    tokens, hidden = out.shape
    out, shared = out.contiguous(), shared.contiguous()
    y = torch.empty_like(out)
    r = _residual_rows(residual, y)
    block = min(1024, next_power_of_2(hidden))
    with launch_device(out):
        _gated_add_kernel[(tokens, cdiv(hidden, block))](out, shared, gate_logit, r, y, hidden,
                                                                gate_logit.stride(0), RESIDUAL=residual is not None,
                                                                BLOCK_H=block, num_warps=4, **dependent_launch(out))
    return y
