"""GatedRMSNorm: the RMSNorm-then-SiLU-gate applied to Gated DeltaNet's output, per value head."""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton


class GatedRMSNorm(nn.Module):
    """``y = (w * x / rms(x)) * silu(z)``.

    NOTE: unlike the hybrids' other norms this weight is *not* zero-centred: the reference
    (``Qwen3NextRMSNormGated`` / ``Qwen3_5RMSNormGated``) stores it as is, initialized to ones.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from stagewise.kernels.rms_norm_triton import rms_norm

            return rms_norm(x, self.weight, self.eps, gate=gate)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * nn.functional.silu(gate.to(torch.float32))).to(dtype)
