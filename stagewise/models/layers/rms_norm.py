"""RMSNorm as the reference implementations compute it (in float32, weight applied after)."""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton


class RMSNorm(nn.Module):
    """``y = w * x / rms(x)``; with ``zero_centered`` the stored weight is an offset: ``(1 + w)``."""

    def __init__(self, dim: int, eps: float, zero_centered: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.zero_centered = zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + residual, norm(x + residual))``: the residual add fused into the norm on the Triton path."""
        if use_triton(x):
            from stagewise.kernels.rms_norm_triton import add_rms_norm

            return add_rms_norm(x, residual, self.weight, self.eps, self.zero_centered)
        total = x + residual
        return total, self.forward(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton(x):
            from stagewise.kernels.rms_norm_triton import rms_norm

            return rms_norm(x, self.weight, self.eps, self.zero_centered)
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centered:
            # NOTE: the hybrid reference multiplies in float32 before casting back.
            return (h * (1.0 + self.weight.float())).to(dtype)
        return self.weight * h.to(dtype)
