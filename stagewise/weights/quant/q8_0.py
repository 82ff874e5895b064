"""Q8_0Weight: a matrix (or a stack of expert matrices) resident as llama.cpp's Q8_0.

Layout on the device: ``qs`` int8 ``(..., out, in)`` and ``scales`` float16
``(..., out, in // 32)``; value = ``qs * scale`` of its 32-element block. Resident bytes are
34 per 32 elements (32 int8 + one f16 scale), the same as in the file.

Matmul dispatch is explicit and depends only on the weight's device and the number of input rows.
On the Triton path (``kernels/triton_launch.use_triton``): at most :data:`GEMV_MAX_TOKENS` rows (one decode
row) -> :mod:`stagewise.kernels.q8_0_gemv_triton`, more rows (batched decode, prefill) ->
:mod:`stagewise.kernels.q8_0_gemm`; both read the int8 values directly. Otherwise (CPU, other
devices) -> dequantize a bounded tile of rows at a time and multiply with the device's matmul (no
dense copy is ever kept). Same inputs on the same device kind -> same kernel, so a staged run and a
single-device run agree bit for bit.
"""

from __future__ import annotations

import torch

from stagewise.kernels.triton_launch import use_triton
from stagewise.weights.quant.tiled_linear import tiled_linear

BLOCK = 32  # elements per Q8_0 block
BLOCK_BYTES = 34  # 2 (f16 scale) + 32 (int8 values)
TILE_ELEMENTS = 1 << 22  # dequantized elements per matmul tile (16 MiB at float32)
_LOAD_CHUNK_BLOCKS = 1 << 20  # blocks copied to the device per step while loading (34 MiB)


# NOTE: the GEMV converts every weight value once per row (issue-bound from a few rows); the few-rows GEMM once
# for all rows. Qwen3.6-35B-A3B Q8_0 on an H200, decode tok/s at 1/2/4/8/16 streams: GEMV up to 16 rows 416 /
# 544 / 640 / 690 / 844, up to 2 (or 3) 416 / 543 / 744 / 1,070 / 1,865 (session14/gemv_gemm_ab*.jsonl). With
# the GEMM's launches at 264 programs at least (q8_0_gemm.DENSE_MIN_PROGRAMS), on an H100: GEMV up to 2 rows 396
# / 531 / 844 / 1,123 / 1,711, up to 1 396 / 558 / 846 / 1,125 / 1,714 (bench/results/hybrid_serving_h200/
# session15/programs_ab*.jsonl)
GEMV_MAX_TOKENS = 1  # at most this many rows: the GEMV kernel; more: the few-rows tensor-core GEMM


class Q8_0Weight:
    """Q8_0-packed weight of logical shape ``(out, in)`` or ``(experts, out, in)``."""

    format_name = "q8_0"

    def __init__(self, qs: torch.Tensor, scales: torch.Tensor) -> None:
        if qs.dtype != torch.int8 or scales.dtype != torch.float16:
            raise ValueError("Q8_0 needs int8 values and float16 scales")
        if qs.shape[-1] % BLOCK or tuple(scales.shape) != (*qs.shape[:-1], qs.shape[-1] // BLOCK):
            raise ValueError(f"Q8_0 scales {tuple(scales.shape)} do not match values {tuple(qs.shape)}")
        self.qs = qs
        self.scales = scales

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
        """Overwrite every value from GGUF Q8_0 blocks, copying a bounded chunk at a time."""
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
        return tuple(self.qs.shape)

    @property
    def nbytes(self) -> int:
        return self.qs.numel() * 1 + self.scales.numel() * 2  # int8 values + f16 scales

    @property
    def device(self) -> torch.device:
        return self.qs.device

    def expert(self, index: int) -> Q8_0Weight:
        """The 2-D weight of expert ``index`` (views, no copy)."""
        if self.qs.dim() != 3:
            raise ValueError("expert() needs a 3-D (experts, out, in) weight")
        return Q8_0Weight(self.qs[index], self.scales[index])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense matrix (or stack, sliced along its first dimension)."""
        return self._dequantize_rows(0, self.qs.shape[0], dtype)

    def _dequantize_rows(self, lo: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
        qs = self.qs[lo:hi].to(torch.float32).unflatten(-1, (-1, BLOCK))  # (r, …, in/32, 32)
        return (qs * self.scales[lo:hi].to(torch.float32)[..., None]).flatten(-2).to(dtype)  # (r, …, in)

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (any shape) of a 2-D weight -> ``(*ids.shape, in)`` in ``dtype`` (token embeddings):
        only those rows are read and dequantized."""
        flat = ids.reshape(-1)
        rows = Q8_0Weight(self.qs.index_select(0, flat), self.scales.index_select(0, flat))
        return rows.dequantize(dtype).reshape(*ids.shape, self.qs.shape[-1])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x (..., in)`` -> ``(..., out)`` in ``x``'s dtype (2-D weights only)."""
        if self.qs.dim() != 2:
            raise ValueError("matmul needs a 2-D weight; use expert(e) for stacked experts")
        tokens = x.numel() // max(x.shape[-1], 1)
        if not use_triton(self.qs):
            return self._tiled_matmul(x)
        if tokens <= GEMV_MAX_TOKENS:
            from stagewise.kernels.q8_0_gemv_triton import q8_0_gemv

            return q8_0_gemv(x, self.qs, self.scales).reshape(*x.shape[:-1], self.qs.shape[0])
        from stagewise.kernels.q8_0_gemm import q8_0_gemm

        return q8_0_gemm(x, self.qs, self.scales)  # prefill: one launch, int8 dequantized in registers

    def matmul_glu(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(gate) * up`` of a fused gate/up weight in one launch where the few-rows GEMM takes ``x``'s rows
        (more than :data:`GEMV_MAX_TOKENS`, at most ``q8_0_gemm.DECODE_ROWS``, Triton path): its epilogue, with the
        tiles and K split of :meth:`matmul` over the whole weight, so bit for bit ``silu_mul(matmul(x))``; else None."""
        from stagewise.kernels.q8_0_gemm import DECODE_ROWS, q8_0_gemm

        tokens = x.numel() // max(x.shape[-1], 1)
        if self.qs.dim() != 2 or not use_triton(self.qs) or not GEMV_MAX_TOKENS < tokens <= DECODE_ROWS:
            return None
        return q8_0_gemm(x, self.qs, self.scales, glu=True)

    def _tiled_matmul(self, x: torch.Tensor) -> torch.Tensor:
        out_features, in_features = self.qs.shape
        return tiled_linear(x, out_features, in_features, self._dequantize_rows, TILE_ELEMENTS)

    def routing(self, expert_index: torch.Tensor) -> None:
        """None: the gathered path reads no one-expert blocks (a GEMV a slot)."""
        return None

    def gather_matmul(self, expert_index: torch.Tensor, x: torch.Tensor, x_repeat: int = 1,
                      routes: object = None) -> torch.Tensor:
        """Row ``m // x_repeat`` of ``x (M / x_repeat, in)`` times expert ``expert_index[m]``'s matrix -> ``(M, out)``.

        Reads only the routed experts; no host synchronization (CUDA graph safe). ``routes`` (another
        stack's :meth:`routing`) is not read: this path sorts nothing.
        """
        if self.qs.dim() != 3:
            raise ValueError("gather_matmul needs a 3-D (experts, out, in) weight")
        if use_triton(self.qs):
            from stagewise.kernels.q8_0_gemv_triton import q8_0_gemv

            return q8_0_gemv(x, self.qs, self.scales, expert_index, x_repeat=x_repeat)
        if x_repeat > 1:
            x = x.repeat_interleave(x_repeat, dim=0)  # (M, in)
        routed = Q8_0Weight(self.qs.index_select(0, expert_index), self.scales.index_select(0, expert_index))
        return torch.bmm(routed.dequantize(x.dtype), x[:, :, None]).squeeze(-1)  # (M, out)

    supports_grouped = True  # the grouped MoE GEMM (kernels/moe_grouped_triton) reads qs and scales

    def fused_with(self, others: list[object]) -> Q8_0Weight | None:
        """This weight's rows followed by ``others``' (fused q/k/v, gate/up), or None when they differ in kind."""
        parts = [self, *others]
        if not all(isinstance(p, Q8_0Weight) and p.qs.dim() == 2 for p in parts):
            return None
        q8 = [p for p in parts if isinstance(p, Q8_0Weight)]
        return Q8_0Weight(torch.cat([p.qs for p in q8], dim=0), torch.cat([p.scales for p in q8], dim=0))

    def to(self, device: torch.device) -> Q8_0Weight:
        return Q8_0Weight(self.qs.to(device), self.scales.to(device))

    def __repr__(self) -> str:
        return f"Q8_0Weight(shape={self.shape}, device={self.qs.device})"
