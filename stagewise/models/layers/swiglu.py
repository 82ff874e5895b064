"""SwiGLU MLP: ``down(silu(gate(x)) * up(x))``."""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.fused_linear import fuse_linears
from stagewise.models.layers.linear import Linear


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias)
        self.gate_up: Linear | None = None  # gate and up as one matmul, after fuse()

    def fuse(self) -> None:
        """Replace gate_proj + up_proj by one matmul (after loading)."""
        self.gate_up = fuse_linears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MLP's output, plus ``residual`` when given (added by the down projection)."""
        if self.gate_up is not None and use_triton(x):
            return self.down_proj(self.gate_up.glu(x), residual)
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)  # (..., I) each
            return self.down_proj(nn.functional.silu(gate) * up, residual)
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x), residual)
