"""PackedWeight: a matrix, expert stack or embedding resident as the GGUF file's blocks, byte for byte.

Every block-quantized type of :data:`~stagewise.spec.packed_types.PACKED` except Q8_0 (which
has its own split layout, :class:`~stagewise.weights.quant.q8_0.Q8_0Weight`) is held this way:
``raw`` uint8 ``(*lead, out, row_bytes)`` with ``row_bytes = in / block_elements * block_bytes``,
the rows exactly as the file stores them. Resident bytes are the file's bytes.

A column permutation that does not move whole blocks (Qwen3.5's value heads in ``out_proj`` when a
head is shorter than a 256-value super-block) is kept as ``input_index``: the weight stays in file
column order and the activation is gathered instead (``ours @ x == file @ x[..., input_index]``).

Dispatch depends only on the device and the number of input rows, so equal inputs always run the
same kernel (staged = single-device):

* Triton devices, at most ``GEMV_MAX_TOKENS`` rows (decode): the packed GEMV
  (:mod:`stagewise.kernels.packed_gemv_triton`), blocks dequantized in registers;
* Triton devices, fewer than ``DEQUANT_MATMUL_MIN_ROWS`` rows (batched decode): the packed GEMM
  (:mod:`stagewise.kernels.packed_gemm`), each tile's blocks dequantized in registers feeding
  ``tl.dot``; experts through the grouped MoE GEMM the same way (``supports_grouped``);
* Triton devices, more rows (prefill): a bounded tile of rows (``DEVICE_TILE_ELEMENTS`` values)
  dequantized by the Triton kernel and multiplied by the device's matmul, tile after tile;
* elsewhere (CPU): the same with ``TILE_ELEMENTS``-value tiles dequantized by the torch reference
  (:mod:`.dequant`). Never a whole dense copy; the tile is charged as workspace
  (:func:`~stagewise.spec.workspace_bytes.dequant_tile_bytes`).
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.triton_launch import use_triton
from stagewise.spec.packed_types import (
    DEQUANT_MATMUL_MIN_ROWS,
    DEVICE_TILE_ELEMENTS,
    TILE_ELEMENTS,
    block_elements,
    format_name,
    row_bytes,
)
from stagewise.weights.quant.dequant import dequantize
from stagewise.weights.quant.tiled_linear import tiled_linear

GEMV_MAX_TOKENS = 16  # rows up to which the packed GEMV runs (decode); more: dequantized tiles + matmul


class PackedWeight:
    """Packed weight of logical shape ``(out, in)`` or ``(experts, out, in)`` in ``ggml_type``."""

    def __init__(self, raw: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int,
                 input_index: torch.Tensor | None = None) -> None:
        if raw.dtype != torch.uint8 or raw.dim() < 2:
            raise ValueError("a packed weight needs uint8 blocks of shape (..., out, row_bytes)")
        if in_features % block_elements(ggml_type) or raw.shape[-1] != row_bytes(ggml_type, in_features):
            raise ValueError(f"{ggml_type.name}: {raw.shape[-1]} bytes per row do not hold {in_features} values")
        if input_index is not None and tuple(input_index.shape) != (in_features,):
            raise ValueError("input_index must name every input column once")
        self.raw = raw
        self.ggml_type = ggml_type
        self.in_features = in_features
        self.input_index = input_index
        self.format_name = format_name(ggml_type)

    @property
    def shape(self) -> tuple[int, ...]:
        # (out, in), or (experts, out, in): satisfies QuantizedWeight / QuantizedExperts respectively
        return (*self.raw.shape[:-1], self.in_features)

    @property
    def nbytes(self) -> int:
        # NOTE: the blocks only; an input_index (in int64 values, Qwen3.5 out_proj only) is < 0.01 % of them
        return self.raw.numel()

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def expert(self, index: int) -> PackedWeight:
        """The 2-D weight of expert ``index`` (a view, no copy)."""
        if self.raw.dim() != 3:
            raise ValueError("expert() needs a 3-D (experts, out, in) weight")
        return PackedWeight(self.raw[index], self.ggml_type, self.in_features, self.input_index)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense matrix (or stack) in our column order (for tests and references)."""
        dense = self._dequantize_raw(self.raw, dtype)
        if self.input_index is not None:
            inverse = torch.empty_like(self.input_index)
            inverse[self.input_index] = torch.arange(self.in_features, device=inverse.device)
            dense = dense.index_select(-1, inverse)
        return dense

    def _dequantize_raw(self, raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``raw`` ``(..., rows, row_bytes)`` -> ``(..., rows, in)`` in ``dtype``, in file column order."""
        lead = raw.shape[:-1]
        flat = raw.reshape(-1, raw.shape[-1])
        if use_triton(flat) and flat.shape[0] > 0:
            from stagewise.kernels.packed_dequant_triton import dequantize_rows

            return dequantize_rows(flat, self.ggml_type, self.in_features, dtype).reshape(*lead, self.in_features)
        values = dequantize(flat.reshape(-1), self.ggml_type, (flat.shape[0], self.in_features))
        return values.to(dtype).reshape(*lead, self.in_features)

    def _gathered_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.input_index is None else x.index_select(-1, self.input_index)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x (..., in)`` -> ``(..., out)`` in ``x``'s dtype (2-D weights only)."""
        if self.raw.dim() != 2:
            raise ValueError("matmul needs a 2-D weight; use expert(e) for stacked experts")
        x = self._gathered_input(x)
        tokens = x.numel() // max(x.shape[-1], 1)
        if use_triton(self.raw) and 0 < tokens <= GEMV_MAX_TOKENS:
            from stagewise.kernels.packed_gemv_triton import packed_gemv

            y = packed_gemv(x.reshape(-1, self.in_features), self.raw, self.ggml_type, self.in_features)
            return y.reshape(*x.shape[:-1], self.raw.shape[0])
        if use_triton(self.raw) and 0 < tokens < DEQUANT_MATMUL_MIN_ROWS:
            from stagewise.kernels.packed_gemm import packed_gemm

            return packed_gemm(x, self.raw, self.ggml_type, self.in_features)
        return self._tiled_matmul(x, DEVICE_TILE_ELEMENTS if use_triton(self.raw) else TILE_ELEMENTS)

    def _tiled_matmul(self, x: torch.Tensor, tile_elements: int) -> torch.Tensor:
        return tiled_linear(x, self.raw.shape[0], self.in_features,
                            lambda lo, hi, dtype: self._dequantize_raw(self.raw[lo:hi], dtype), tile_elements)

    def gather_matmul(self, expert_index: torch.Tensor, x: torch.Tensor, x_repeat: int = 1) -> torch.Tensor:
        """Row ``m // x_repeat`` of ``x (M / x_repeat, in)`` times expert ``expert_index[m]``'s matrix -> ``(M, out)``.

        Reads only the routed experts; no host synchronization (CUDA graph safe).
        """
        if self.raw.dim() != 3:
            raise ValueError("gather_matmul needs a 3-D (experts, out, in) weight")
        x = self._gathered_input(x)
        if use_triton(self.raw) and expert_index.numel() <= GATHER_MAX_ROWS:
            from stagewise.kernels.packed_gemv_triton import packed_gemv

            return packed_gemv(x, self.raw, self.ggml_type, self.in_features, expert_index, x_repeat=x_repeat)
        if x_repeat > 1:
            x = x.repeat_interleave(x_repeat, dim=0)  # (M, in)
        routed = self._dequantize_raw(self.raw.index_select(0, expert_index), x.dtype)  # (M, out, in)
        return torch.bmm(routed, x[:, :, None]).squeeze(-1)  # (M, out)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (any shape) of a 2-D weight -> ``(*ids.shape, in)`` in ``dtype``: only those
        rows are read and dequantized (token embeddings)."""
        if self.raw.dim() != 2 or self.input_index is not None:
            raise ValueError("embed needs a 2-D weight in file column order")
        rows = self.raw.index_select(0, ids.reshape(-1))  # (n, row_bytes)
        return self._dequantize_raw(rows, dtype).reshape(*ids.shape, self.in_features)

    def select_rows(self, index: torch.Tensor) -> PackedWeight:
        """Rows ``index`` of the out dimension (a layout's row permutation), as a new weight."""
        return PackedWeight(self.raw.index_select(-2, index.to(self.raw.device)).contiguous(), self.ggml_type,
                            self.in_features, self.input_index)

    @staticmethod
    def concat(parts: list[PackedWeight], dim: int) -> PackedWeight:
        """Parts of one type joined along ``dim`` of the logical shape: the out dimension (rows of bytes)
        or the last (each row's blocks one after the other)."""
        first = parts[0]
        if any(p.ggml_type != first.ggml_type or p.input_index is not None for p in parts):
            raise ValueError("only packed weights of one type, in file column order, can be joined")
        last = first.raw.dim() - 1
        dim = dim % first.raw.dim()
        raw = torch.cat([p.raw for p in parts], dim=dim)
        in_features = sum(p.in_features for p in parts) if dim == last else first.in_features
        return PackedWeight(raw.contiguous(), first.ggml_type, in_features)

    supports_grouped = True  # the grouped MoE GEMM reads the blocks (kernels/moe_grouped_triton, PACKED)

    def fused_with(self, others: list[object]) -> PackedWeight | None:
        """This weight's rows followed by ``others``' (fused q/k/v, gate/up), or None when they differ in kind."""
        parts = [self, *others]
        if not all(isinstance(p, PackedWeight) and p.raw.dim() == 2 and p.in_features == self.in_features
                   and p.ggml_type == self.ggml_type and p.input_index is None for p in parts):
            return None
        return PackedWeight.concat([p for p in parts if isinstance(p, PackedWeight)], 0)

    def to(self, device: torch.device) -> PackedWeight:
        index = self.input_index.to(device) if self.input_index is not None else None
        return PackedWeight(self.raw.to(device), self.ggml_type, self.in_features, index)

    def __repr__(self) -> str:
        return f"PackedWeight({self.ggml_type.name}, shape={self.shape}, device={self.raw.device})"


GATHER_MAX_ROWS = 64  # routed (token, expert) rows up to which experts are gathered by the packed GEMV
