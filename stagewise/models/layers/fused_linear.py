"""fuse_linears: several projections of the same input as one matmul (q/k/v, gate/up).

One wider matmul reads the same bytes as the separate ones but launches once, and a wider GEMV
keeps more of the GPU busy during decode. Fusion happens after loading, on every stage alike, so
staged and single-device runs still execute the same kernels on the same shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.models.layers.linear import Linear
from stagewise.models.layers.quantized_weight import QuantizedWeight


def fuse_linears(parts: list[Linear]) -> Linear | None:
    """One Linear whose output is the parts' outputs concatenated, or None where they differ in
    kind (dense vs packed, bias vs none, dtype or device). The parts' storage is released."""
    dense = all(p.weight is not None and p.quantized is None for p in parts)
    packed = all(p.quantized is not None for p in parts)
    if not (dense or packed) or len({p.bias is None for p in parts}) != 1:
        return None
    in_features = parts[0].in_features
    if any(p.in_features != in_features for p in parts):
        return None
    out_features = sum(p.out_features for p in parts)
    with torch.device("meta"):  # no allocation: the concatenated tensors are assigned below
        fused = Linear(in_features, out_features, bias=parts[0].bias is not None)
    if dense:
        weights: list[torch.Tensor] = [p.weight for p in parts if p.weight is not None]
        if len({w.dtype for w in weights}) != 1 or len({w.device for w in weights}) != 1:
            return None
        fused.weight = nn.Parameter(torch.cat(weights, dim=0), requires_grad=False)  # (sum out, in)
    else:
        stacked = _cat_packed([p.quantized for p in parts])
        if stacked is None:
            return None
        fused.set_quantized(stacked)
    if parts[0].bias is not None:
        biases: list[torch.Tensor] = [p.bias for p in parts if p.bias is not None]
        fused.bias = nn.Parameter(torch.cat(biases, dim=0), requires_grad=False)
    for p in parts:  # drop the separate copies: the fused matrix is the only one resident
        p.weight, p.bias, p.quantized = None, None, None
    return fused


def _cat_packed(weights: list[QuantizedWeight | None]) -> QuantizedWeight | None:
    first, rest = weights[0], weights[1:]
    return first.fused_with(list(rest)) if first is not None else None
