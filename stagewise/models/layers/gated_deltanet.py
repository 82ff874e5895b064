"""Gated DeltaNet: the linear-attention mixer of Qwen3-Next and Qwen3.5 / Qwen3.6.

Per step: project to q, k, v (+ output gate z, write strength b, decay input a), run q/k/v through
a short causal depthwise conv (SiLU), then the gated delta rule over an fp32 recurrent state, then
a gated RMSNorm per value head and the output projection.

State (a :class:`RecurrentState`: entry pools addressed through the stage's :class:`StateSlots`):
- ``conv`` ``(E, conv_dim, kernel)`` in the activation dtype: the last ``kernel`` conv inputs;
- ``recurrent`` ``(E, Hv, Dk, Dv)`` float32.
Each segment of a step (a decoding row's token, a prompt's chunk) reads its row's read entry and
writes its write entry. A fresh sequence reads the zero entry, which is exactly the reference's
zero left padding.

Checkpoint layouts: Qwen3-Next packs ``in_proj_qkvz`` / ``in_proj_ba`` grouped per key head;
Qwen3.5 has separate ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` / ``in_proj_a``. Both are kept
under their checkpoint names.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.causal_conv import causal_conv_step, packed_causal_conv
from stagewise.models.layers.decay_gates import DecayGates
from stagewise.models.layers.delta_rule import packed_chunked_gated_delta_rule, packed_recurrent_step
from stagewise.models.layers.fused_linear import FusedGroups
from stagewise.models.layers.gated_rms_norm import GatedRMSNorm
from stagewise.models.layers.linear import Linear
from stagewise.models.recurrent_state import RecurrentState
from stagewise.models.state_slots import StateSlots
from stagewise.models.step_context import StepContext
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
        self.in_proj_fused = FusedGroups()  # after fuse(): the input projections as few matmuls
    def _in_projections(self) -> list[Linear]:
        if self.packed:
            return [self.in_proj_qkvz, self.in_proj_ba]
        return [self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def fuse(self) -> None:
        """Run the input projections as one matmul (after loading); where their storage kinds differ
        (e.g. Q8_0 q/k/v/z beside small float b/a), as one matmul per kind."""
        everything = list(range(len(self._in_projections())))
        self.in_proj_fused.fuse_parts(self._in_projections(), [everything] if self.packed else [everything, [0, 1], [2, 3]])

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The input projections of ``x`` ``(B, T, hidden)`` as the matmuls give them: each fused matmul's
        output, then each part no fused matmul covers. Token by token: a packed step's graph pieces run
        it (:class:`~stagewise.runtime.packed_graphs.PackedGraphs`)."""
        return self.in_proj_fused.project(x, self._in_projections())

    def _parts(self, projected: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        """:meth:`project`'s outputs as one tensor per input projection, in :meth:`_in_projections` order
        (views of the fused outputs)."""
        return self.in_proj_fused.split(projected, self._in_projections())

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                  slots: StateSlots) -> RecurrentState:
        """This block's entry pools over the stage's ``slots``: each entry a conv window ``(C, K)`` in
        ``dtype`` and a recurrent state ``(Hv, Dk, Dv)`` in float32."""
        return RecurrentState({
            "conv": ((self.conv_dim, self.kernel), dtype),
            "recurrent": ((self.v_heads, self.k_dim, self.v_dim), torch.float32),
        }, slots, device)

    def _inputs(self, projected: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``qkv`` ``(B, T, conv_dim)``, ``b`` and ``a`` ``(B, T, Hv)`` of :meth:`project`'s outputs (what
        :meth:`mix` reads; :meth:`_z` the rest)."""
        outs = self._parts(projected)
        batch, steps = outs[0].shape[0], outs[0].shape[1]
        if not self.packed:
            return outs[0], outs[2], outs[3]
        # Qwen3-Next: per key head g, [q_g, k_g, v_g (r heads), z_g (r heads)] and [b_g (r), a_g (r)]
        r = self.v_heads // self.k_heads
        qkvz = outs[0].reshape(batch, steps, self.k_heads, 2 * self.k_dim + 2 * r * self.v_dim)
        q, k, v, _ = torch.split(qkvz, [self.k_dim, self.k_dim, r * self.v_dim, r * self.v_dim], dim=-1)
        b, a = torch.split(outs[1].reshape(batch, steps, self.k_heads, 2 * r), [r, r], dim=-1)
        qkv = torch.cat([t.reshape(batch, steps, -1) for t in (q, k, v)], dim=-1)  # (B, T, conv_dim)
        return qkv, b.reshape(batch, steps, self.v_heads), a.reshape(batch, steps, self.v_heads)

    def _z(self, projected: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The output gate ``z`` ``(B, T, Hv, Dv)`` of :meth:`project`'s outputs (what :meth:`finish` reads)."""
        outs = self._parts(projected)
        batch, steps = outs[0].shape[0], outs[0].shape[1]
        if not self.packed:
            return outs[1].reshape(batch, steps, self.v_heads, self.v_dim)
        r = self.v_heads // self.k_heads  # Qwen3-Next: z_g follows q_g, k_g, v_g in key head g's group
        qkvz = outs[0].reshape(batch, steps, self.k_heads, 2 * self.k_dim + 2 * r * self.v_dim)
        return qkvz[..., 2 * self.k_dim + r * self.v_dim :].reshape(batch, steps, self.v_heads, self.v_dim)

    def forward(self, x: torch.Tensor, state: RecurrentState, ctx: StepContext) -> torch.Tensor:
        projected = self.project(x)
        return self.finish(self.mix(projected, state, ctx), projected)

    def finish(self, mixed: torch.Tensor, projected: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The gated norm (by :meth:`project`'s ``z``) and output projection of :meth:`mix`'s ``(N, Hv, Dv)``:
        ``(B, T, hidden)``. Token by token."""
        z = self._z(projected)
        batch, steps = z.shape[0], z.shape[1]
        out = self.norm(mixed, z.reshape(batch * steps, self.v_heads, self.v_dim))  # (N, Hv, Dv)
        return self.out_proj(out.reshape(batch, steps, self.value_dim))

    def mix(self, projected: tuple[torch.Tensor, ...], state: RecurrentState, ctx: StepContext,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """The conv and the gated delta rule over :meth:`project`'s outputs for the step's tokens as its
        context lays them out (:attr:`StepContext.segment_offsets`): a rectangle's ``B`` rows of ``T``
        new tokens each, or a packed step's ``N`` tokens in segments. Decoding rows (one token each)
        take the recurrent step, their state read from and written to their rows' entries
        (:attr:`StepContext.slot_entries`); prompt segments the chunked rule, by
        :attr:`StepContext.state_segments` (entries and snapshots). Returns the rule's readout ``(N, Hv, Dv)``
        (into ``out`` when given)."""
        qkv, b, a = self._inputs(projected)
        batch, steps = qkv.shape[0], qkv.shape[1]
        tokens = batch * steps
        qkv, b, a = (t.reshape(tokens, *t.shape[2:]) for t in (qkv, b, a))  # one token column
        conv_pool, rec_pool = state.pools["conv"], state.pools["recurrent"]
        decoding, offsets = ctx.segment_offsets
        hi = offsets[decoding]  # the decoding rows' tokens come first
        mixed = qkv.new_empty(qkv.shape)  # (N, C) the conv's output
        if out is None:
            out = qkv.new_empty((tokens, self.v_heads, self.v_dim))  # (N, Hv, Dv) the rule's readout
        if decoding:
            entries = ctx.slot_entries[:decoding]  # (Nd, 2) [read, write], columns of the stage's table
            causal_conv_step(qkv[:hi], self.conv1d.weight, conv_pool, entries[:, 0], entries[:, 1], out=mixed[:hi])
        if hi < tokens:
            segments = ctx.state_segments
            packed_causal_conv(qkv, self.conv1d.weight, conv_pool, segments, out=mixed)
        q, k, v = self._split_heads(mixed)
        gates = DecayGates(b, a, self.A_log, self.dt_bias)  # evaluated where the rule reads them
        if decoding:
            if use_triton(qkv):  # the gates, L2 norms and the state update in one launch, entries in place
                from stagewise.kernels.deltanet_decode_triton import delta_step

                delta_step(mixed[:hi], b[:hi], a[:hi], self.A_log, self.dt_bias, rec_pool, entries[:, 0],
                           entries[:, 1], self.k_heads, self.k_dim, out=out[:hi])
            else:
                out[:hi] = packed_recurrent_step(q[:hi], k[:hi], v[:hi], gates.rows(0, hi), rec_pool, entries[:, 0],
                                                 entries[:, 1])
        if hi < tokens:
            packed_chunked_gated_delta_rule(q, k, v, gates, rec_pool, segments, out=out)
        return out

    def _split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv output ``(N, C)`` as q, k ``(N, Hk, Dk)`` and v ``(N, Hv, Dv)`` (views)."""
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        n = mixed.shape[0]
        return (q.reshape(n, self.k_heads, self.k_dim), k.reshape(n, self.k_heads, self.k_dim),
                v.reshape(n, self.v_heads, self.v_dim))
