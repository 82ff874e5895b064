"""SwiGLU MLP: ``down(silu(gate(x)) * up(x))``."""

from __future__ import annotations

import torch
from torch import nn

from stagewise.models.layers.linear import Linear


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
