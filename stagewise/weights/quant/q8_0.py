"""Q8_0Weight: a matrix (or a stack of expert matrices) resident as llama.cpp's Q8_0.

Layout on the device (:mod:`stagewise.weights.quant.q8_0_layout`): row-major as in the file, ``qs``
int8 ``(..., out, in)`` and ``scales`` float16 ``(..., out, in // 32)``, or panels
(:meth:`Q8_0Weight.to_panels`, for the kernels of expert stacks), ``qs`` ``(..., in/32, out, 32)`` and
``scales`` ``(..., in/32, out)``. Value = ``qs * scale`` of its 32-element block. Resident bytes are 34 per 32 elements (32
int8 + one f16 scale), the same as in the file, in either layout.

Matmul dispatch is explicit and depends only on the weight's device and the number of input rows.
On the Triton path (``kernels/triton_launch.use_triton``): at most 16 rows (decode) ->
:mod:`stagewise.weights.quant.q8_0_gemv_triton`, more rows (prefill) ->
:mod:`stagewise.kernels.q8_0_gemm`; both read the int8 values directly. Otherwise (CPU, other
devices) -> dequantize a bounded tile of rows at a time and multiply with the device's matmul (no
dense copy is ever kept). Same inputs on the same device kind -> same kernel, so a staged run and a
single-device run agree bit for bit.
"""

from __future__ import annotations

import torch

from stagewise.kernels.triton_launch import use_triton
from stagewise.weights.quant.q8_0_layout import Q8_0Layout, panel_layout, row_major_layout

BLOCK = 32  # elements per Q8_0 block
BLOCK_BYTES = 34  # 2 (f16 scale) + 32 (int8 values)
TILE_ELEMENTS = 1 << 22  # dequantized elements per matmul tile (16 MiB at float32)
_LOAD_CHUNK_BLOCKS = 1 << 20  # blocks copied to the device per step while loading (34 MiB)


GEMV_MAX_TOKENS = 16  # few tokens: the GEMV kernel (rows re-read from L2); measured faster than tl.dot


class Q8_0Weight:
    """Q8_0-packed weight of logical shape ``(out, in)`` or ``(experts, out, in)``."""

    format_name = "q8_0"

    def __init__(self, qs: torch.Tensor, scales: torch.Tensor, panels: bool = False) -> None:
        if qs.dtype != torch.int8 or scales.dtype != torch.float16:
            raise ValueError("Q8_0 needs int8 values and float16 scales")
        if panels:
            if qs.dim() not in (3, 4) or qs.shape[-1] != BLOCK or tuple(scales.shape) != tuple(qs.shape[:-1]) \
                    or not (qs.is_contiguous() and scales.is_contiguous()):
                raise ValueError(f"Q8_0 panels {tuple(qs.shape)} / scales {tuple(scales.shape)} are not contiguous "
                                 f"(..., in/{BLOCK}, out, {BLOCK}) values with (..., in/{BLOCK}, out) scales")
        elif qs.shape[-1] % BLOCK or tuple(scales.shape) != (*qs.shape[:-1], qs.shape[-1] // BLOCK):
            raise ValueError(f"Q8_0 scales {tuple(scales.shape)} do not match values {tuple(qs.shape)}")
        self.qs = qs
        self.scales = scales
        self.panels = panels

    @staticmethod
    def empty(shape: tuple[int, ...], device: torch.device) -> Q8_0Weight:
        """Uninitialized buffers of logical ``shape`` on ``device`` (filled by :meth:`fill_from_blocks`)."""
        qs = torch.empty(shape, dtype=torch.int8, device=device)
        scales = torch.empty((*shape[:-1], shape[-1] // BLOCK), dtype=torch.float16, device=device)
        return Q8_0Weight(qs, scales)

    @staticmethod
    def from_blocks(raw: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> Q8_0Weight:
        """Unpack GGUF Q8_0 blocks (``uint8``, ``numel / 32 * 34`` bytes, any device) onto ``device``."""
        weight = Q8_0Weight.empty(shape, device)
        weight.fill_from_blocks(raw)
        return weight

    def fill_from_blocks(self, raw: torch.Tensor) -> None:
        """Overwrite every value from GGUF Q8_0 blocks, copying a bounded chunk at a time (row-major only)."""
        if self.panels:
            raise ValueError("GGUF blocks fill a row-major Q8_0 weight; make panels of it afterwards")
        blocks = raw.reshape(-1, BLOCK_BYTES)
        qs = self.qs.view(-1, BLOCK)
        scales = self.scales.view(-1)
        if blocks.shape[0] != qs.shape[0]:
            raise ValueError(f"{blocks.shape[0]} Q8_0 blocks for {qs.shape[0]} slots")
        for lo in range(0, blocks.shape[0], _LOAD_CHUNK_BLOCKS):
            chunk = blocks[lo : lo + _LOAD_CHUNK_BLOCKS].to(self.qs.device)  # (n, 34) straight to the device
            qs[lo : lo + chunk.shape[0]] = chunk[:, 2:].view(torch.int8)
            scales[lo : lo + chunk.shape[0]] = chunk[:, :2].contiguous().view(torch.float16).view(-1)

    @property
    def shape(self) -> tuple[int, ...]:
        # (out, in), or (experts, out, in): satisfies QuantizedWeight / QuantizedExperts respectively
        if self.panels:
            *lead, blocks, out_features, _ = self.qs.shape
            return (*lead, out_features, blocks * BLOCK)
        return tuple(self.qs.shape)

    @property
    def layout(self) -> Q8_0Layout:
        """Where each value and scale lives (what the kernels address)."""
        if self.panels:
            return panel_layout(self.shape[-2], self.shape[-1], len(self.shape) == 3)
        return row_major_layout(self.qs, self.scales)

    def can_make_panels(self) -> bool:
        """True when :meth:`to_panels` applies: contiguous row-major values and scales."""
        return not self.panels and self.qs.is_contiguous() and self.scales.is_contiguous()

    def to_panels(self) -> Q8_0Weight:
        """This weight in the panel layout, reordered in place one matrix at a time (no second copy of the
        stack is ever held); ``self`` is consumed: its tensors now hold the panel order."""
        if not self.can_make_panels():
            raise ValueError(f"{self!r} cannot be made panels: it needs contiguous row-major values and scales")
        out_features, in_features = self.qs.shape[-2:]
        blocks = in_features // BLOCK
        qs = self.qs.view(-1, out_features, in_features)
        scales = self.scales.view(-1, out_features, blocks)
        for e in range(qs.shape[0]):  # (out, in/32, 32) -> (in/32, out, 32), through a copy of one matrix
            qs[e] = qs[e].view(out_features, blocks, BLOCK).transpose(0, 1).reshape(out_features, in_features)
            scales[e] = scales[e].t().reshape(out_features, blocks)
        lead = tuple(self.qs.shape[:-2])
        return Q8_0Weight(self.qs.view(*lead, blocks, out_features, BLOCK),
                          self.scales.view(*lead, blocks, out_features), panels=True)

    def _row_major(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Values ``(r, …, in)`` and scales ``(r, …, in/32)`` of rows ``lo:hi`` of the first dimension, row-major
        (views; strided for panels)."""
        if not self.panels:
            return self.qs[lo:hi], self.scales[lo:hi]
        if self.qs.dim() == 4:  # a stack: whole experts
            qs, scales = self.qs[lo:hi], self.scales[lo:hi]
        else:  # a matrix: rows lo:hi of every panel
            qs, scales = self.qs[:, lo:hi], self.scales[:, lo:hi]
        return qs.transpose(-3, -2).flatten(-2, -1), scales.transpose(-2, -1)  # (…, out, in), (…, out, in/32)

    @property
    def nbytes(self) -> int:
        return self.qs.numel() * 1 + self.scales.numel() * 2  # int8 values + f16 scales

    @property
    def device(self) -> torch.device:
        return self.qs.device

    def expert(self, index: int) -> Q8_0Weight:
        """The 2-D weight of expert ``index`` (views, no copy)."""
        if len(self.shape) != 3:
            raise ValueError("expert() needs a 3-D (experts, out, in) weight")
        return Q8_0Weight(self.qs[index], self.scales[index], self.panels)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense matrix (or stack, sliced along its first dimension)."""
        return self._dequantize_rows(0, self.shape[0], dtype)

    def _dequantize_rows(self, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        values, scales = self._row_major(lo, hi)
        qs = values.to(torch.float32).unflatten(-1, (-1, BLOCK))  # (r, …, in/32, 32)
        return (qs * scales.to(torch.float32)[..., None]).flatten(-2).to(dtype)  # (r, …, in)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x (..., in)`` -> ``(..., out)`` in ``x``'s dtype (2-D weights only)."""
        if len(self.shape) != 2:
            raise ValueError("matmul needs a 2-D weight; use expert(e) for stacked experts")
        tokens = x.numel() // max(x.shape[-1], 1)
        if not use_triton(self.qs):
            return self._tiled_matmul(x)
        if tokens <= GEMV_MAX_TOKENS:
            from stagewise.weights.quant.q8_0_gemv_triton import q8_0_gemv

            return q8_0_gemv(x, self).reshape(*x.shape[:-1], self.shape[0])
        from stagewise.kernels.q8_0_gemm import q8_0_gemm

        return q8_0_gemm(x, self)  # prefill: one launch, int8 dequantized in registers

    def _tiled_matmul(self, x: torch.Tensor) -> torch.Tensor:
        out_features, in_features = self.shape
        rows = max(1, TILE_ELEMENTS // in_features)  # depends on the weight only: same tiles every call
        if rows >= out_features:
            return torch.nn.functional.linear(x, self._dequantize_rows(0, out_features, x.dtype))
        y = x.new_empty((*x.shape[:-1], out_features))
        for lo in range(0, out_features, rows):
            hi = min(lo + rows, out_features)
            y[..., lo:hi] = torch.nn.functional.linear(x, self._dequantize_rows(lo, hi, x.dtype))
        return y

    def gather_matmul(self, expert_index: torch.Tensor, x: torch.Tensor, x_repeat: int = 1) -> torch.Tensor:
        """Row ``m // x_repeat`` of ``x (M / x_repeat, in)`` times expert ``expert_index[m]``'s matrix -> ``(M, out)``.

        Reads only the routed experts; no host synchronization (CUDA graph safe).
        """
        if len(self.shape) != 3:
            raise ValueError("gather_matmul needs a 3-D (experts, out, in) weight")
        if use_triton(self.qs):
            from stagewise.weights.quant.q8_0_gemv_triton import q8_0_gemv

            return q8_0_gemv(x, self, expert_index, x_repeat=x_repeat)
        if x_repeat > 1:
            x = x.repeat_interleave(x_repeat, dim=0)  # (M, in)
        routed = Q8_0Weight(self.qs.index_select(0, expert_index), self.scales.index_select(0, expert_index),
                            self.panels)
        return torch.bmm(routed.dequantize(x.dtype), x[:, :, None]).squeeze(-1)  # (M, out)

    def to(self, device: torch.device) -> Q8_0Weight:
        return Q8_0Weight(self.qs.to(device), self.scales.to(device), self.panels)

    def __repr__(self) -> str:
        panels = ", panels" if self.panels else ""
        return f"Q8_0Weight(shape={self.shape}, device={self.qs.device}{panels})"
