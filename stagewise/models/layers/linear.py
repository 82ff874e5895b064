"""Linear: a projection whose weight is resident either dense or quantized.

Dense weights are an ``nn.Parameter`` named ``weight`` (HF checkpoint layout (out, in)), so the
safetensors name maps stay identity tables. A quantized weight replaces it through
:meth:`Linear.set_quantized`, which stores the packed representation as buffers and drops the
dense parameter: no dequantized copy is kept.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.quantized_weight import QuantizedWeight

_HALF = (torch.bfloat16, torch.float16)


class Linear(nn.Module):
    """``y = x @ W.T (+ b)``, W dense ``(out_features, in_features)`` or quantized."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(out_features, in_features))
        self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features)) if bias else None
        self.quantized: QuantizedWeight | None = None

    def set_quantized(self, qweight: QuantizedWeight) -> None:
        """Make ``qweight`` the resident weight; its logical shape must be (out, in)."""
        if tuple(qweight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"quantized weight shape {qweight.shape} != {(self.out_features, self.in_features)}")
        self.weight = None
        self.quantized = qweight

    def set_quantized_param(self, name: str, qweight: QuantizedWeight, dtype: torch.dtype | None = None) -> None:
        """Loader hook: parameter ``name`` (only ``weight``) arrives packed (``dtype``, the run dtype, is
        not needed: the output takes the activation's dtype)."""
        if name != "weight":
            raise ValueError(f"Linear cannot hold {name!r} quantized")
        self.set_quantized(qweight)

    def quantized_weights(self) -> list[QuantizedWeight]:
        return [self.quantized] if self.quantized is not None else []

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, aligned: bool = False) -> torch.Tensor:
        """``x @ W.T (+ b)``, plus ``residual`` (the output's shape) when given: on the GEMV path the add
        is the GEMV's epilogue (one launch fewer), with the same rounding as the separate add. ``aligned``
        (dense, no bias or residual): where the matmul library runs it, the output may be a view whose rows
        start 16 bytes apart (:func:`_aligned_linear`); consumers read it through its strides."""
        y: torch.Tensor | None = None
        if self.quantized is not None:
            y = self.quantized.matmul(x)
        else:
            assert self.weight is not None
            if use_triton(x) and self.weight.dtype in _HALF and x.dtype == self.weight.dtype:
                from stagewise.kernels.gemv_triton import GEMV_MAX_TOKENS, config_for, gemv
                from stagewise.kernels.triton_launch import dependent_launch

                config = config_for(self.out_features, self.in_features, dependent_launch(x)["GDC"])
                if config is not None and x.numel() // self.in_features <= GEMV_MAX_TOKENS:  # decode, where ours beats cuBLAS
                    fused = residual is not None and self.bias is None and residual.dtype == x.dtype
                    y = gemv(x, self.weight, config=config, residual=residual if fused else None)
                    if fused:
                        return y
            if y is None:
                aligned = aligned and self.bias is None and residual is None and x.dtype == self.weight.dtype
                y = _aligned_linear(x, self.weight) if aligned else nn.functional.linear(x, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y if residual is None else y + residual

    def glu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of this fused gate/up projection (gate columns then up columns, no bias), on the
        Triton path: one launch where the quantized format has one (:meth:`QuantizedWeight.matmul_glu`), else the
        matmul then ``silu_mul``, with the same bits."""
        from stagewise.kernels.silu_mul_triton import silu_mul

        fused = self.quantized.matmul_glu(x) if self.quantized is not None and self.bias is None else None
        return fused if fused is not None else silu_mul(self(x))

    def extra_repr(self) -> str:
        fmt = self.quantized.format_name if self.quantized is not None else "dense"
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, format={fmt}"


def _aligned_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` written into a buffer whose rows start 16 bytes apart, returned as a view of its first
    ``out`` columns. An output width that is not a multiple of 16 bytes (a router with its shared expert's gate
    logit as one more row: 257) sends cuBLAS to its unaligned kernels: on an H100, Qwen3.6's router at 8 tokens
    ran ``cutlass_75_tensorop_s1688gemm_bf16_64x64_tn_align1`` and a split-K reduce, 7.9 us a layer."""
    out = weight.shape[0]
    per_row = 16 // x.element_size()
    width = -(-out // per_row) * per_row
    if width == out:
        return nn.functional.linear(x, weight)
    rows = x.reshape(-1, x.shape[-1])
    y = torch.empty((rows.shape[0], width), dtype=x.dtype, device=x.device)[:, :out]
    torch.mm(rows, weight.t(), out=y)  # cuBLAS writes a row-strided output in place (no copy)
    return y.view(*x.shape[:-1], out)
