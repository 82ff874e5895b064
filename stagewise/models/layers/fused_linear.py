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


class FusedGroups(nn.Module):
    """Projections of one input (``parts``, in their order) run as few matmuls after loading: each candidate group of
    part indices fused where :func:`fuse_linears` can, the search ending at the first group that covers every part
    (q/k/v, or q/k with v apart where v is stored in another type; a Gated DeltaNet's four input projections, or
    q/k/v/z and b/a). Outputs are the fused matmuls' then each uncovered part's, split back per part on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = nn.ModuleList()
        self.groups: list[list[int]] = []

    def fuse_parts(self, parts: list[Linear], candidates: list[list[int]]) -> None:
        """(Not ``fuse``: the stage calls every module's ``fuse()`` after loading, and the owning layer calls this.)"""
        everything = list(range(len(parts)))
        for group in candidates:
            fused = fuse_linears([parts[i] for i in group])
            if fused is not None:
                self.fused.append(fused)
                self.groups.append(group)
                if group == everything:
                    return

    def project(self, x: torch.Tensor, parts: list[Linear]) -> tuple[torch.Tensor, ...]:
        """The projections of ``x`` as the matmuls give them: each fused matmul's output, then each part no fused
        matmul covers."""
        covered = {i for group in self.groups for i in group}
        return (*(linear(x) for linear in self.fused), *(part(x) for i, part in enumerate(parts) if i not in covered))

    def split(self, projected: tuple[torch.Tensor, ...], parts: list[Linear]) -> list[torch.Tensor]:
        """:meth:`project`'s outputs as one tensor per part, in ``parts`` order (views of the fused outputs)."""
        outs: list[torch.Tensor | None] = [None] * len(parts)
        for fused, group in zip(projected, self.groups, strict=False):
            for i, piece in zip(group, fused.split([parts[i].out_features for i in group], dim=-1), strict=True):
                outs[i] = piece
        rest = iter(projected[len(self.groups):])
        return [out if out is not None else next(rest) for out in outs]
