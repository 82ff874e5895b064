"""Gated DeltaNet's causal depthwise conv + SiLU over a packed step's segments, in one Triton launch.

Same contract as :func:`stagewise.models.layers.causal_conv.packed_causal_conv` (windows read and
written by index, snapshots). One program takes one :data:`CHUNK`-token chunk of one segment and
``BLOCK_C`` channels: for each of its tokens it sums the ``K`` taps (inputs before the segment's first
token come from the read entry's window) in float32, rounds as the reference rounds, and stores the
SiLU. The program whose chunk ends the segment writes the final window, and the one whose chunk ends
at the snapshot boundary writes the snapshot window. A token's result depends only on its inputs, so
the chunking of a prompt over steps never changes it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2
from stagewise.models.layers.packed_segments import CHUNK, PackedSegments

BLOCK_T = 16  # tokens per inner tile (a chunk is CHUNK // BLOCK_T of them)
BLOCK_C = 128  # channels per program


@triton.jit
def _window_store(x_ptr, pool_ptr, src, dst, bos, boundary, c, c_ok, stride_xn, stride_pe,
                  KERNEL: tl.constexpr, K_PAD: tl.constexpr):
    """Store into entry ``dst`` the ``K`` inputs before token ``boundary`` of the segment starting at
    ``bos`` (older ones from entry ``src``'s window)."""
    j = tl.arange(0, K_PAD)
    tok = boundary - KERNEL + j  # (K_PAD,) absolute token of each window slot
    in_seg = tok >= bos
    ok = c_ok[:, None] & (j < KERNEL)[None, :]
    xv = tl.load(x_ptr + tok[None, :].to(tl.int64) * stride_xn + c[:, None], mask=ok & in_seg[None, :], other=0.0)
    old = tl.load(pool_ptr + src * stride_pe + c[:, None] * KERNEL + (KERNEL + tok - bos)[None, :],
                  mask=ok & ~in_seg[None, :], other=0.0)
    value = tl.where(in_seg[None, :], xv.to(pool_ptr.dtype.element_ty), old)  # (BLOCK_C, K_PAD)
    tl.store(pool_ptr + dst * stride_pe + c[:, None] * KERNEL + j[None, :], value, mask=ok)


@triton.jit
def _packed_conv_kernel(
    x_ptr, w_ptr, pool_ptr, y_ptr, cu_ptr, read_ptr, write_ptr, snap_ptr, snap_at_ptr, chunks_ptr,
    channels, stride_xn, stride_yn, stride_pe,
    KERNEL: tl.constexpr, K_PAD: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr, GDC: tl.constexpr,
):
    wait_for_predecessor(GDC)
    chunk = tl.program_id(0)
    seg = tl.load(chunks_ptr + 2 * chunk)
    first = tl.load(chunks_ptr + 2 * chunk + 1)
    bos = tl.load(cu_ptr + seg)
    eos = tl.load(cu_ptr + seg + 1)
    src = tl.load(read_ptr + seg).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < channels
    w_type = w_ptr.dtype.element_ty
    for sub in tl.static_range(CHUNK // BLOCK_T):
        t = first + sub * BLOCK_T + tl.arange(0, BLOCK_T)  # (BLOCK_T,) absolute tokens
        t_ok = t < eos
        acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for j in tl.static_range(KERNEL):  # tap j reads the input K - 1 - j tokens back
            tok = t - (KERNEL - 1) + j
            in_seg = tok >= bos
            xv = tl.load(x_ptr + tok[:, None].to(tl.int64) * stride_xn + c[None, :],
                         mask=(t_ok & in_seg)[:, None] & c_ok[None, :], other=0.0)
            old = tl.load(pool_ptr + src * stride_pe + c[None, :] * KERNEL + (KERNEL + tok - bos)[:, None],
                          mask=(t_ok & ~in_seg)[:, None] & c_ok[None, :], other=0.0)
            v = tl.where(in_seg[:, None], xv.to(pool_ptr.dtype.element_ty), old)  # (BLOCK_T, BLOCK_C)
            w = tl.load(w_ptr + c * KERNEL + j, mask=c_ok, other=0.0).to(tl.float32)
            acc += v.to(w_type).to(tl.float32) * w[None, :]
        acc = acc.to(w_type).to(tl.float32)  # the reference's conv output is rounded
        silu = (acc * tl.sigmoid(acc)).to(w_type)
        tl.store(y_ptr + t[:, None].to(tl.int64) * stride_yn + c[None, :], silu.to(y_ptr.dtype.element_ty),
                 mask=t_ok[:, None] & c_ok[None, :])
    end = tl.minimum(first + CHUNK, eos)
    if end == eos:
        dst = tl.load(write_ptr + seg).to(tl.int64)
        _window_store(x_ptr, pool_ptr, src, dst, bos, end, c, c_ok, stride_xn, stride_pe, KERNEL, K_PAD)
    if end - bos == tl.load(snap_at_ptr + seg):  # snap_at is 0 (none) or a chunk end
        snap = tl.load(snap_ptr + seg).to(tl.int64)
        _window_store(x_ptr, pool_ptr, src, snap, bos, end, c, c_ok, stride_xn, stride_pe, KERNEL, K_PAD)

def packed_causal_conv_triton(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                              segments: PackedSegments, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`~stagewise.models.layers.causal_conv.packed_causal_conv` in one launch."""
    channels, kernel = conv_pool.shape[1], conv_pool.shape[2]
    if x.shape[-1] != channels or x.stride(-1) != 1 or weight.numel() != channels * kernel:
        raise ValueError(f"packed conv: inputs {tuple(x.shape)} (channels contiguous) and weight "
                         f"{tuple(weight.shape)} do not match windows of {channels} x {kernel}")
    if conv_pool.stride(-1) != 1 or conv_pool.stride(-2) != kernel:
        raise ValueError("packed conv needs row-major (C, K) windows")
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif out.shape != x.shape or out.stride(-1) != 1:
        raise ValueError(f"packed conv: out {tuple(out.shape)} must match x {tuple(x.shape)}, channels contiguous")
    if segments.count == 0:
        return out
    w = weight.reshape(channels, kernel).contiguous()
    grid = (segments.chunk_count, cdiv(channels, BLOCK_C))
    with launch_device(x):
        _packed_conv_kernel[grid](
            x, w, conv_pool, out, segments.cu_seqlens, segments.read, segments.write, segments.snap,
            segments.snap_at, segments.chunks, channels, x.stride(0), out.stride(0), conv_pool.stride(0),
            KERNEL=kernel, K_PAD=next_power_of_2(kernel), CHUNK=CHUNK, BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C,
            num_warps=4, **dependent_launch(x),
        )
    return out
