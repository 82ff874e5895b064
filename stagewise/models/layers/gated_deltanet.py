"""Gated DeltaNet: the linear-attention mixer of Qwen3-Next and Qwen3.5 / Qwen3.6.

Per step: project to q, k, v (+ output gate z, write strength b, decay input a), run q/k/v through
a short causal depthwise conv (SiLU), then the gated delta rule over an fp32 recurrent state, then
a gated RMSNorm per value head and the output projection.

State (a :class:`RecurrentState`, double-buffered, explicit):
- ``conv`` ``(B, conv_dim, kernel)`` in the activation dtype: the last ``kernel`` conv inputs;
- ``recurrent`` ``(B, Hv, Dk, Dv)`` float32.
A fresh sequence starts from zeros, which is exactly the reference's zero left padding.

Checkpoint layouts: Qwen3-Next packs ``in_proj_qkvz`` / ``in_proj_ba`` grouped per key head;
Qwen3.5 has separate ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``. Both are kept
under their checkpoint names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from stagewise.models.layers.delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from stagewise.models.layers.gated_rms_norm import GatedRMSNorm
from stagewise.models.layers.linear import Linear
from stagewise.models.state import RecurrentState
from stagewise.spec.model_config import ModelConfig


class GatedDeltaNet(nn.Module):
    """Linear attention over a fixed-size state; ``packed`` selects Qwen3-Next's fused projections."""

    def __init__(self, config: ModelConfig, packed: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.k_heads, self.v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        self.conv_dim, self.kernel = config.linear_conv_dim, config.linear_conv_kernel_dim
        self.packed = packed
        if packed:
            self.in_proj_qkvz = Linear(hidden, 2 * self.key_dim + 2 * self.value_dim)
            self.in_proj_ba = Linear(hidden, 2 * self.v_heads)
        else:
            self.in_proj_qkv = Linear(hidden, self.conv_dim)
            self.in_proj_z = Linear(hidden, self.value_dim)
            self.in_proj_b = Linear(hidden, self.v_heads)
            self.in_proj_a = Linear(hidden, self.v_heads)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, bias=False, groups=self.conv_dim)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden)

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device) -> RecurrentState:
        return RecurrentState({
            "conv": ((batch, self.conv_dim, self.kernel), dtype),
            "recurrent": ((batch, self.v_heads, self.k_dim, self.v_dim), torch.float32),
        }, device)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``qkv`` ``(B, T, conv_dim)``, ``z`` ``(B, T, Hv, Dv)``, ``b`` and ``a`` ``(B, T, Hv)``."""
        batch, steps, _ = x.shape
        if not self.packed:
            z = self.in_proj_z(x).view(batch, steps, self.v_heads, self.v_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        # Qwen3-Next: per key head g, [q_g, k_g, v_g (r heads), z_g (r heads)] and [b_g (r), a_g (r)]
        r = self.v_heads // self.k_heads
        qkvz = self.in_proj_qkvz(x).view(batch, steps, self.k_heads, 2 * self.k_dim + 2 * r * self.v_dim)
        q, k, v, z = torch.split(qkvz, [self.k_dim, self.k_dim, r * self.v_dim, r * self.v_dim], dim=-1)
        b, a = torch.split(self.in_proj_ba(x).view(batch, steps, self.k_heads, 2 * r), [r, r], dim=-1)
        qkv = torch.cat([t.reshape(batch, steps, -1) for t in (q, k, v)], dim=-1)  # (B, T, conv_dim)
        z = z.reshape(batch, steps, self.v_heads, self.v_dim)
        return qkv, z, b.reshape(batch, steps, self.v_heads), a.reshape(batch, steps, self.v_heads)

    def forward(self, x: torch.Tensor, state: RecurrentState) -> torch.Tensor:
        """``x`` ``(B, T, H)``: every row's ``T`` tokens are new tokens of that row's sequence."""
        batch, steps, _ = x.shape
        if state.read("conv").shape[0] > batch:
            state.sync_rows(batch)  # rows not in this step keep their published state
        qkv, z, b, a = self._project(x)

        window = torch.cat([state.read("conv")[:batch], qkv.transpose(1, 2)], dim=-1)  # (B, C, K + T)
        state.write("conv", window[..., -self.kernel :])
        weight = self.conv1d.weight  # (C, 1, K)
        # output t sees inputs t+1 .. t+K of the window: the K-1 previous inputs and itself
        mixed = F.conv1d(window[..., 1:].to(weight.dtype), weight, groups=self.conv_dim)  # (B, C, T)
        mixed = F.silu(mixed).to(x.dtype).transpose(1, 2)  # (B, T, C)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(batch, steps, self.k_heads, self.k_dim)
        k = k.reshape(batch, steps, self.k_heads, self.k_dim)
        v = v.reshape(batch, steps, self.v_heads, self.v_dim)

        beta = b.sigmoid()  # (B, T, Hv) write strength
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)  # (B, T, Hv) log decay
        rule = recurrent_gated_delta_rule if steps == 1 else chunked_gated_delta_rule
        out, recurrent = rule(q, k, v, g, beta, state.read("recurrent")[:batch])  # (B, T, Hv, Dv)
        state.write("recurrent", recurrent)

        out = self.norm(out, z).reshape(batch, steps, self.value_dim)
        return self.out_proj(out)
