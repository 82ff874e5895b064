"""Gated DeltaNet's short causal depthwise conv (then SiLU) over a packed step, windows read and written by index.

Each channel ``c`` of token ``t`` is ``silu(sum_j weight[c, 0, j] * input[t - K + 1 + j, c])`` over the
token and the ``K - 1`` inputs before it; before a segment's first token those come from the conv
window of its state entry. A window holds the last ``K`` conv inputs of a sequence, oldest first
(``(C, K)`` per entry, the activation dtype); the zero entry is a fresh sequence (the reference's zero
left padding). Rounding as ``GatedDeltaNet.forward`` rounds: the conv's inputs in the weight's dtype,
accumulated in float32, the conv output and the SiLU rounded to the weight's dtype, the result to
the input's.

:func:`packed_causal_conv` runs a step's segments (any length) and :func:`causal_conv_step` one token
of each decoding row; both take the Triton path where ``use_triton`` says so.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.packed_segments import CHUNK, PackedSegments


def packed_causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, segments: PackedSegments,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """The conv + SiLU of every segment token of a packed step.

    Args:
        x: ``(N, C)`` conv inputs (channel dim contiguous); weight: ``(C, 1, K)`` (as ``nn.Conv1d`` keeps it).
        conv_pool: windows ``(E, C, K)``. Segment ``s`` continues the window of entry
            ``segments.read[s]``; the window after its last token goes to ``segments.write[s]`` and, where
            ``segments.snap_at[s] > 0``, the window after that many of its tokens to ``segments.snap[s]``
            (older inputs from the read window when the boundary is closer than ``K`` to the segment start).
        out: ``(N, C)`` to write the segments' tokens into (allocated when None; other tokens untouched).
    Returns:
        ``out`` in ``x``'s dtype.

    The reference path computes each segment :data:`CHUNK` tokens at a time (one chunk's shapes
    whatever else shares the call, so a prompt split at chunk boundaries gives the same bits).
    """
    if use_triton(x):
        from stagewise.kernels.causal_conv_triton import packed_causal_conv_triton

        return packed_causal_conv_triton(x, weight, conv_pool, segments, out)
    return packed_causal_conv_reference(x, weight, conv_pool, segments, out)


def packed_causal_conv_reference(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                                 segments: PackedSegments, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`packed_causal_conv`'s torch path, on any device (a Python loop over chunks)."""
    channels, kernel = conv_pool.shape[1], conv_pool.shape[2]
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    offsets = segments.offsets
    for s in range(segments.count):
        window = conv_pool.index_select(0, segments.read[s : s + 1])[0]  # (C, K)
        inputs = torch.cat([window.transpose(0, 1), x[offsets[s] : offsets[s + 1]].to(window.dtype)])  # (K + n, C)
        # token i of the segment sees inputs[i + 1 : i + K + 1]
        for first in range(0, offsets[s + 1] - offsets[s], CHUNK):
            n = min(CHUNK, offsets[s + 1] - offsets[s] - first)
            taps = F.pad(inputs[first + 1 : first + n + kernel], (0, 0, 0, CHUNK - n))  # (K - 1 + C, C)
            mixed = F.conv1d(taps.to(weight.dtype).transpose(0, 1)[None], weight, groups=channels)[0]  # (C, CHUNK)
            lo = offsets[s] + first
            out[lo : lo + n] = F.silu(mixed).transpose(0, 1)[:n].to(out.dtype)
        _pool_write(conv_pool, segments.write[s : s + 1], inputs[-kernel:].transpose(0, 1))
        at = segments.snap_tokens[s]
        if at:
            _pool_write(conv_pool, segments.snap[s : s + 1], inputs[at : at + kernel].transpose(0, 1))
    return out


def causal_conv_step(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, read: torch.Tensor,
                     write: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """One token of each of ``B`` decoding rows through the conv + SiLU.

    Args:
        x: ``(B, C)`` the new inputs; weight: ``(C, 1, K)``; conv_pool: ``(E, C, K)``;
        read, write: ``(B,)`` int32 entries: row ``b`` continues window ``read[b]`` and writes the
            shifted window to ``write[b]`` (no entry both read and written).
        out: ``(B, C)`` for the result (allocated when None), last dim contiguous.
    Returns:
        ``(B, C)`` in ``x``'s dtype (``out``).
    """
    if use_triton(x):
        from stagewise.kernels.deltanet_decode_triton import conv_step

        return conv_step(x, weight, conv_pool, read, write, out=out)
    mixed = causal_conv_step_reference(x, weight, conv_pool, read, write)
    if out is None:
        return mixed
    out.copy_(mixed)
    return out


def causal_conv_step_reference(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor, read: torch.Tensor,
                               write: torch.Tensor) -> torch.Tensor:
    """:func:`causal_conv_step`'s torch path, on any device."""
    channels = conv_pool.shape[1]
    window = torch.cat([conv_pool.index_select(0, read)[..., 1:], x[..., None].to(conv_pool.dtype)], dim=-1)  # (B, C, K)
    _pool_write(conv_pool, write, window)
    mixed = F.conv1d(window.to(weight.dtype), weight, groups=channels)[..., 0]  # (B, C)
    return F.silu(mixed).to(x.dtype)


def _pool_write(pool: torch.Tensor, entries: torch.Tensor, value: torch.Tensor) -> None:
    """``pool[entries[i]] = value[i]`` (``value`` ``(C, K)`` for a single entry), without a host sync."""
    pool.index_put_((entries,), value.reshape(entries.shape[0], *pool.shape[1:]))
