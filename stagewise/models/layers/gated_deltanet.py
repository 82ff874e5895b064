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

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from stagewise.models.layers.fused_linear import fuse_linears
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
        # after fuse(): the input projections as few matmuls; in_proj_groups[j] lists the parts
        # (indices into _in_projections()) whose outputs in_proj_fused[j] concatenates
        self.in_proj_fused = nn.ModuleList()
        self.in_proj_groups: list[list[int]] = []

    def _in_projections(self) -> list[Linear]:
        if self.packed:
            return [self.in_proj_qkvz, self.in_proj_ba]
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def fuse(self) -> None:
        """Run the input projections as one matmul (after loading); where their storage kinds differ
        (e.g. Q8_0 q/k/v/z beside small float b/a), as one matmul per kind."""
        parts = self._in_projections()
        everything = list(range(len(parts)))
        for group in [everything] if self.packed else [everything, [0, 1], [2, 3]]:
            fused = fuse_linears([parts[i] for i in group])
            if fused is not None:
                self.in_proj_fused.append(fused)
                self.in_proj_groups.append(group)
                if group == everything:
                    return

    def _in_proj(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The input projections' outputs, in :meth:`_in_projections` order."""
        parts = self._in_projections()
        outs: list[torch.Tensor | None] = [None] * len(parts)
        for linear, group in zip(self.in_proj_fused, self.in_proj_groups, strict=True):
            pieces = linear(x).split([parts[i].out_features for i in group], dim=-1)
            for i, piece in zip(group, pieces, strict=True):
                outs[i] = piece
        return [out if out is not None else part(x) for out, part in zip(outs, parts, strict=True)]

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device) -> RecurrentState:
        return RecurrentState({
            "conv": ((batch, self.conv_dim, self.kernel), dtype),
            "recurrent": ((batch, self.v_heads, self.k_dim, self.v_dim), torch.float32),
        }, device)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``qkv`` ``(B, T, conv_dim)``, ``z`` ``(B, T, Hv, Dv)``, ``b`` and ``a`` ``(B, T, Hv)``."""
        batch, steps, _ = x.shape
        outs = self._in_proj(x)
        if not self.packed:
            qkv, z, b, a = outs
            return qkv, z.reshape(batch, steps, self.v_heads, self.v_dim), b, a
        # Qwen3-Next: per key head g, [q_g, k_g, v_g (r heads), z_g (r heads)] and [b_g (r), a_g (r)]
        r = self.v_heads // self.k_heads
        qkvz = outs[0].reshape(batch, steps, self.k_heads, 2 * self.k_dim + 2 * r * self.v_dim)
        q, k, v, z = torch.split(qkvz, [self.k_dim, self.k_dim, r * self.v_dim, r * self.v_dim], dim=-1)
        b, a = torch.split(outs[1].reshape(batch, steps, self.k_heads, 2 * r), [r, r], dim=-1)
        qkv = torch.cat([t.reshape(batch, steps, -1) for t in (q, k, v)], dim=-1)  # (B, T, conv_dim)
        z = z.reshape(batch, steps, self.v_heads, self.v_dim)
        return qkv, z, b.reshape(batch, steps, self.v_heads), a.reshape(batch, steps, self.v_heads)

    def forward(self, x: torch.Tensor, state: RecurrentState, rows: slice) -> torch.Tensor:
        """``x`` ``(B, T, H)``: every row's ``T`` tokens are new tokens of that row's sequence, whose
        state is row ``rows.start + b`` of ``state``."""
        batch, steps, _ = x.shape
        qkv, z, b, a = self._project(x)
        if steps == 1 and use_triton(x):
            return self._decode_fused(qkv, z, b, a, state, rows)

        window = torch.cat([state.read("conv", rows), qkv.transpose(1, 2)], dim=-1)  # (B, C, K + T)
        state.write("conv", window[..., -self.kernel :], rows)
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
        out, recurrent = rule(q, k, v, g, beta, state.read("recurrent", rows))  # (B, T, Hv, Dv)
        state.write("recurrent", recurrent, rows)

        out = self.norm(out, z).reshape(batch, steps, self.value_dim)
        return self.out_proj(out)

    def _decode_fused(self, qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      state: RecurrentState, rows: slice) -> torch.Tensor:
        """One token per sequence through the Triton decode kernels (same math as ``forward``)."""
        from stagewise.kernels.deltanet_decode_triton import conv_step, delta_step
        from stagewise.kernels.rms_norm_triton import rms_norm

        batch = qkv.shape[0]
        # the double-buffered rows as pools of 2 x rows entries: read the published, write the provisional
        parity, slots = state.active(rows), len(state.parity)
        read, write = parity * slots + rows.start, (1 - parity) * slots + rows.start
        state.mark_written(rows)
        conv, recurrent = (state.buffers[name].flatten(0, 1) for name in ("conv", "recurrent"))
        mixed = conv_step(qkv[:, 0], self.conv1d.weight, conv, read, write)  # (B, C)
        out = delta_step(mixed, b[:, 0], a[:, 0], self.A_log, self.dt_bias, recurrent, read, write,
                         self.k_heads, self.k_dim)  # (B, Hv, Dv)
        out = rms_norm(out, self.norm.weight, self.norm.eps, gate=z[:, 0])  # (B, Hv, Dv)
        return self.out_proj(out.reshape(batch, 1, self.value_dim))
