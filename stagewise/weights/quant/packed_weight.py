"""PackedWeight: a matrix, expert stack or embedding resident as the GGUF file's blocks, split into planes.

Every block-quantized type of :data:`~stagewise.spec.packed_types.PACKED` except Q8_0 (which has its
own split layout, :class:`~stagewise.weights.quant.q8_0.Q8_0Weight`) is held this way: three uint8
planes ``(*lead, out, plane bytes)`` (:class:`~stagewise.spec.packed_types.PlaneLayout`): ``qs`` the
quant bytes, ``qh`` the high bits (last dim 0 where the type has none), ``meta`` the scales and mins,
each row's blocks in order. The planes are the file's bytes, regrouped at load
(:mod:`.packed_planes`): resident bytes are the file's, and the values are the file's bit for bit.

A column permutation that does not move whole blocks (Qwen3.5's value heads in ``out_proj`` when a
head is shorter than a 256-value super-block) is kept as ``input_index``: the weight stays in file
column order and the activation is gathered instead (``ours @ x == file @ x[..., input_index]``).

Dispatch depends only on the device, the number of input rows, the shape and the input's dtype
(:func:`matmul_path`), so equal inputs always run the same kernel (staged = single-device); every packed
type takes the same path:

* Triton devices, one row of :data:`GEMV_ONE_ROW_TYPES` (single-stream decode), or of the word GEMV's types
  (Q4_K, Q5_K, Q6_K, IQ4_XS) with bf16 input and ``in`` of 256-1024 or a multiple of 2048: the packed GEMV
  (the word GEMV where it applies);
* Triton devices, 1-16 rows (decode): kernel A (:mod:`stagewise.kernels.packed_matmul`), each quant
  turned into bf16 once, a tensor-core dot per scale group for every row, the scales after it;
* Triton devices, 17-128 rows (batched decode): kernel B, each value dequantized and rounded once,
  every row in one block;
* Triton devices, more rows (prefill): a bounded tile of rows (``DEVICE_TILE_ELEMENTS`` values)
  dequantized by the Triton kernel and multiplied by the device's matmul, tile after tile;
* elsewhere (CPU): the same with ``TILE_ELEMENTS``-value tiles dequantized by the torch reference
  (:mod:`.dequant`, on the rows joined back). Never a whole dense copy; the tile is charged as
  workspace (:func:`~stagewise.spec.workspace_bytes.dequant_tile_bytes`).

Routed experts (:meth:`PackedWeight.gather_matmul`, MoE decode): up to 8 slots (one token's top 8)
through the packed GEMV (:mod:`stagewise.kernels.packed_gemv_triton`), more sorted into one-expert
blocks and through kernel A, so an expert routed to several tokens is read once.
"""

from __future__ import annotations

import math

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.expert_stacks import check_planes
from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.packed_matmul import B_MAX_ROWS, kernel_a_max_rows
from stagewise.kernels.triton_launch import use_triton
from stagewise.kernels.word_gemv_triton import words_config
from stagewise.spec.packed_types import DEVICE_TILE_ELEMENTS, TILE_ELEMENTS, format_name
from stagewise.weights.quant.dequant import dequantize
from stagewise.weights.quant.packed_planes import join_planes, split_planes
from stagewise.weights.quant.tiled_linear import tiled_linear

# one row of these types: the packed GEMV (its 8-byte slots) beats kernel A on the H200 (Q4_K, Llama-8B shapes:
# 67 vs 90 us gate/up, 41 vs 52 us down; bench/results/hybrid_serving_h200/packed_decode_h200.json). One row of
# the word GEMV's types and shapes (kernels/word_gemv_triton.py) takes the GEMV too: on an H100 37.4 us against
# kernel A's 88.5 (Q4_K gate/up), 57.0 against 96.3 (Q6_K; bench/results/gemv_words_h200)
GEMV_ONE_ROW_TYPES = frozenset({GGMLQuantizationType.Q4_K})
EXPERT_BLOCK_ROWS = 16  # slots a one-expert block of the blocked path holds (kernel A's rows)
GATHER_GEMV_SLOTS = 8  # routed (token, expert) slots the GEMV takes (one token's top 8); more: one-expert blocks (kernel A)
GLU_MAX_ROWS = 16  # rows up to which a fused gate/up runs SiLU·up in its matmul's epilogue (kernel A or B; 0: never)
GATHER_MAX_ROWS = 64  # routed (token, expert) rows the gathered paths are meant for (Experts sends more to its grouped GEMM)


def matmul_path(rows: int, ggml_type: GGMLQuantizationType, in_features: int, x_dtype: torch.dtype) -> str:
    """The path of a 2-D packed matmul of ``rows`` input rows of ``x_dtype`` and an ``in_features``-wide matrix
    of ``ggml_type`` on a Triton device: ``"gemv"`` (the packed GEMV: one row of :data:`GEMV_ONE_ROW_TYPES`, or
    of a type and shape the word GEMV takes), ``"A"`` (kernel A), ``"B"`` (kernel B) or ``"tiles"``
    (dequantized tiles and the device's matmul)."""
    if rows == 1 and (ggml_type in GEMV_ONE_ROW_TYPES or words_config(ggml_type, in_features, False, x_dtype)):
        return "gemv"
    if 0 < rows <= kernel_a_max_rows(ggml_type):
        return "A"
    if 0 < rows <= B_MAX_ROWS:
        return "B"
    return "tiles"


class PackedWeight:
    """Packed weight of logical shape ``(out, in)`` or ``(experts, out, in)`` in ``ggml_type``, as planes."""

    def __init__(self, qs: torch.Tensor, qh: torch.Tensor, meta: torch.Tensor, ggml_type: GGMLQuantizationType,
                 in_features: int, input_index: torch.Tensor | None = None) -> None:
        check_planes(qs, qh, meta, ggml_type, in_features, dims=(2, 3))
        if input_index is not None and tuple(input_index.shape) != (in_features,):
            raise ValueError("input_index must name every input column once")
        self.qs = qs
        self.qh = qh
        self.meta = meta
        self.ggml_type = ggml_type
        self.in_features = in_features
        self.input_index = input_index
        self.format_name = format_name(ggml_type)

    @staticmethod
    def from_rows(raw: torch.Tensor, ggml_type: GGMLQuantizationType, in_features: int,
                  input_index: torch.Tensor | None = None) -> PackedWeight:
        """The weight of file rows ``raw`` uint8 ``(..., out, row_bytes)``, repacked on ``raw``'s device."""
        if raw.dtype != torch.uint8 or raw.dim() not in (2, 3):
            raise ValueError("a packed weight needs uint8 blocks of shape (..., out, row_bytes)")
        return PackedWeight(*split_planes(raw, ggml_type), ggml_type, in_features, input_index)

    def rows(self) -> torch.Tensor:
        """The file rows ``(..., out, row_bytes)`` back from the planes (tests, references, export)."""
        return join_planes(self.qs, self.qh, self.meta, self.ggml_type)

    @property
    def planes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qs, self.qh, self.meta

    @property
    def shape(self) -> tuple[int, ...]:
        # (out, in), or (experts, out, in): satisfies QuantizedWeight / QuantizedExperts respectively
        return (*self.qs.shape[:-1], self.in_features)

    @property
    def nbytes(self) -> int:
        # NOTE: the planes only; an input_index (in int64 values, Qwen3.5 out_proj only) is < 0.01 % of them
        return sum(p.numel() for p in self.planes)

    @property
    def device(self) -> torch.device:
        return self.qs.device

    def _with(self, planes: tuple[torch.Tensor, ...], input_index: torch.Tensor | None = None) -> PackedWeight:
        return PackedWeight(planes[0], planes[1], planes[2], self.ggml_type, self.in_features, input_index)

    def expert(self, index: int) -> PackedWeight:
        """The 2-D weight of expert ``index`` (views, no copy)."""
        if self.qs.dim() != 3:
            raise ValueError("expert() needs a 3-D (experts, out, in) weight")
        return self._with(tuple(p[index] for p in self.planes), self.input_index)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense matrix (or stack) in our column order (for tests and references)."""
        dense = self._dequantize_planes(self.planes, dtype)
        if self.input_index is not None:
            inverse = torch.empty_like(self.input_index)
            inverse[self.input_index] = torch.arange(self.in_features, device=inverse.device)
            dense = dense.index_select(-1, inverse)
        return dense

    def _dequantize_planes(self, planes: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
        """Planes ``(..., rows, bytes)`` -> ``(..., rows, in)`` in ``dtype``, in file column order."""
        lead = planes[0].shape[:-1]
        flat = tuple(p.reshape(math.prod(lead), p.shape[-1]) for p in planes)  # NOTE: an empty qh has no -1
        if use_triton(flat[0]) and flat[0].shape[0] > 0:
            from stagewise.kernels.packed_dequant_triton import dequantize_rows

            values = dequantize_rows(flat[0], flat[1], flat[2], self.ggml_type, self.in_features, dtype)
            return values.reshape(*lead, self.in_features)
        raw = join_planes(flat[0], flat[1], flat[2], self.ggml_type)  # (rows, row_bytes)
        values = dequantize(raw.reshape(-1), self.ggml_type, (raw.shape[0], self.in_features))
        return values.to(dtype).reshape(*lead, self.in_features)

    def _gathered_input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.input_index is None else x.index_select(-1, self.input_index)

    def matmul_glu(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(gate) * up`` of a fused 2-D gate/up weight in one launch where ``x``'s rows take kernel A or B
        (:func:`matmul_path`, Triton path, at most :data:`GLU_MAX_ROWS`): its epilogue, with the tiles and K split
        of :meth:`matmul` over the whole weight, so bit for bit ``silu_mul(matmul(x))``; else None (one row's GEMV:
        its epilogue measured slower; more rows; prefill tiles)."""
        tokens = x.numel() // max(x.shape[-1], 1)
        if (self.qs.dim() != 2 or self.input_index is not None or not use_triton(self.qs) or tokens > GLU_MAX_ROWS
                or matmul_path(tokens, self.ggml_type, self.in_features, x.dtype) not in ("A", "B")):
            return None
        from stagewise.kernels.packed_matmul import packed_matmul_glu

        return packed_matmul_glu(x, self)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x (..., in)`` -> ``(..., out)`` in ``x``'s dtype (2-D weights only)."""
        if self.qs.dim() != 2:
            raise ValueError("matmul needs a 2-D weight; use expert(e) for stacked experts")
        x = self._gathered_input(x)
        tokens = x.numel() // max(x.shape[-1], 1)
        path = matmul_path(tokens, self.ggml_type, self.in_features, x.dtype)
        if use_triton(self.qs) and path == "gemv":
            from stagewise.kernels.packed_gemv_triton import packed_gemv

            return packed_gemv(x, self).reshape(*x.shape[:-1], -1)  # (..., out)
        if use_triton(self.qs) and path != "tiles":  # kernel A or B
            from stagewise.kernels.packed_matmul import packed_matmul

            return packed_matmul(x, self)
        return self._tiled_matmul(x, DEVICE_TILE_ELEMENTS if use_triton(self.qs) else TILE_ELEMENTS)

    def _tiled_matmul(self, x: torch.Tensor, tile_elements: int) -> torch.Tensor:
        return tiled_linear(x, self.qs.shape[0], self.in_features,
                            lambda lo, hi, dtype: self._dequantize_planes(tuple(p[lo:hi] for p in self.planes), dtype),
                            tile_elements)

    def routing(self, expert_index: torch.Tensor) -> MoeAlignment | None:
        """The slots of ``expert_index (M,)`` sorted into the one-expert blocks :meth:`gather_matmul` reads for
        them, or None where it reads none (the GEMV's few slots, or off the Triton path). A function of the
        slots and the expert count only: a layer's gate/up and down stacks share it (one alignment a layer)."""
        if not use_triton(self.qs) or expert_index.numel() <= GATHER_GEMV_SLOTS:
            return None
        from stagewise.kernels.moe_align import moe_align
        from stagewise.kernels.moe_align_triton import MAX_FUSED_SLOTS, moe_align_fused

        align_fn = moe_align_fused if expert_index.numel() <= MAX_FUSED_SLOTS else moe_align
        return align_fn(expert_index.reshape(-1, 1), self.qs.shape[0], EXPERT_BLOCK_ROWS)

    def gather_matmul(self, expert_index: torch.Tensor, x: torch.Tensor, x_repeat: int = 1,
                      routes: MoeAlignment | None = None) -> torch.Tensor:
        """Row ``m // x_repeat`` of ``x (M / x_repeat, in)`` times expert ``expert_index[m]``'s matrix -> ``(M, out)``.

        Reads only the routed experts; no host synchronization (CUDA graph safe). ``routes``: :meth:`routing`
        of these slots, made once for the layer's stacks (made here when None).
        """
        if self.qs.dim() != 3:
            raise ValueError("gather_matmul needs a 3-D (experts, out, in) weight")
        x = self._gathered_input(x)
        if use_triton(self.qs) and expert_index.numel() <= GATHER_GEMV_SLOTS:
            from stagewise.kernels.packed_gemv_triton import packed_gemv

            return packed_gemv(x, self, expert_index, x_repeat=x_repeat)
        if use_triton(self.qs):
            routes = routes if routes is not None else self.routing(expert_index)
            assert routes is not None  # more slots than the GEMV's, on the Triton path
            return self._blocked_matmul(x, x_repeat, routes)
        if x_repeat > 1:
            x = x.repeat_interleave(x_repeat, dim=0)  # (M, in)
        routed = self._dequantize_planes(tuple(p.index_select(0, expert_index) for p in self.planes), x.dtype)
        return torch.bmm(routed, x[:, :, None]).squeeze(-1)  # (M, out)

    def _blocked_matmul(self, x: torch.Tensor, x_repeat: int, routes: MoeAlignment) -> torch.Tensor:
        """Routed slots sorted into 16-row one-expert blocks (``routes``), each expert's tile read once for all its
        slots (kernel A); slot ``m`` reads row ``m // x_repeat``. No host synchronization."""
        from stagewise.kernels.packed_decode_triton import packed_decode_gemm
        from stagewise.kernels.packed_matmul import expert_tiles

        a = x if x.stride(-1) == 1 else x.contiguous()
        return packed_decode_gemm(a, self, routes, x_repeat, expert_tiles(self.ggml_type, self.in_features, x.device),
                                  gather_rows=True)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (any shape) of a 2-D weight -> ``(*ids.shape, in)`` in ``dtype``: only those
        rows are read and dequantized (token embeddings)."""
        if self.qs.dim() != 2 or self.input_index is not None:
            raise ValueError("embed needs a 2-D weight in file column order")
        flat = ids.reshape(-1)
        rows = tuple(p.index_select(0, flat) for p in self.planes)  # (n, plane bytes) each
        return self._dequantize_planes(rows, dtype).reshape(*ids.shape, self.in_features)

    def select_rows(self, index: torch.Tensor) -> PackedWeight:
        """Rows ``index`` of the out dimension (a layout's row permutation), as a new weight."""
        index = index.to(self.qs.device)
        return self._with(tuple(p.index_select(-2, index).contiguous() for p in self.planes), self.input_index)

    def select_experts(self, index: torch.Tensor) -> PackedWeight:
        """Experts ``index`` of a 3-D stack (a layout's permutation of the first dimension), as a new weight."""
        index = index.to(self.qs.device)
        return self._with(tuple(p.index_select(0, index).contiguous() for p in self.planes), self.input_index)

    @staticmethod
    def concat(parts: list[PackedWeight], dim: int) -> PackedWeight:
        """Parts of one type joined along ``dim`` of the logical shape: the out dimension (rows) or the
        last (each row's blocks one after the other: every plane holds its blocks in order)."""
        first = parts[0]
        if any(p.ggml_type != first.ggml_type or p.input_index is not None for p in parts):
            raise ValueError("only packed weights of one type, in file column order, can be joined")
        last = first.qs.dim() - 1
        dim = dim % first.qs.dim()
        planes = [torch.cat([p.planes[i] for p in parts], dim=dim).contiguous() for i in range(3)]
        in_features = sum(p.in_features for p in parts) if dim == last else first.in_features
        return PackedWeight(planes[0], planes[1], planes[2], first.ggml_type, in_features)

    supports_grouped = True  # the grouped MoE GEMM reads the planes (kernels/moe_grouped_triton, PACKED)

    def fused_with(self, others: list[object]) -> PackedWeight | None:
        """This weight's rows followed by ``others``' (fused q/k/v, gate/up), or None when they differ in kind."""
        parts = [self, *others]
        if not all(isinstance(p, PackedWeight) and p.qs.dim() == 2 and p.in_features == self.in_features
                   and p.ggml_type == self.ggml_type and p.input_index is None for p in parts):
            return None
        return PackedWeight.concat([p for p in parts if isinstance(p, PackedWeight)], 0)

    def to(self, device: torch.device) -> PackedWeight:
        index = self.input_index.to(device) if self.input_index is not None else None
        return self._with(tuple(p.to(device) for p in self.planes), index)

    def __repr__(self) -> str:
        return f"PackedWeight({self.ggml_type.name}, shape={self.shape}, device={self.qs.device})"

