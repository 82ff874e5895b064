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
from torch.nn import functional as F

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from stagewise.models.layers.fused_linear import fuse_linears
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

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                  slots: StateSlots) -> RecurrentState:
        """This block's entry pools over the stage's ``slots``: each entry a conv window ``(C, K)`` in
        ``dtype`` and a recurrent state ``(Hv, Dk, Dv)`` in float32."""
        return RecurrentState({
            "conv": ((self.conv_dim, self.kernel), dtype),
            "recurrent": ((self.v_heads, self.k_dim, self.v_dim), torch.float32),
        }, slots, device)

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

    def forward(self, x: torch.Tensor, state: RecurrentState, ctx: StepContext) -> torch.Tensor:
        """``x`` ``(B, T, H)``: the step's tokens as its context lays them out (:attr:`StepContext.segment_offsets`):
        a rectangle's ``B`` rows of ``T`` new tokens each, or a packed step's ``N`` tokens ``(N, 1, H)``
        in segments; each segment's state read from and written to its row's entries
        (:attr:`StepContext.slot_entries`)."""
        batch, steps, _ = x.shape
        qkv, z, b, a = self._project(x)
        tokens = batch * steps
        qkv, z, b, a = (t.reshape(tokens, *t.shape[2:]) for t in (qkv, z, b, a))  # one token column
        decoding, offsets = ctx.segment_offsets
        entries = ctx.slot_entries  # (S, 2) [read, write]
        parts: list[torch.Tensor] = []
        if decoding:  # one token per row: the recurrent step
            hi = offsets[decoding]
            parts.append(self._decode_rows(qkv[:hi], b[:hi], a[:hi], state, entries[:decoding]))  # (Nd, Hv, Dv)
        if decoding < len(offsets) - 1:  # prompts' chunks: the chunked rule, segment by segment
            lo = offsets[decoding]
            bounds = [o - lo for o in offsets[decoding:]]
            snapshots = {seg - decoding: (tokens, entry) for seg, tokens, entry in ctx.layout.snapshots} \
                if ctx.layout is not None else {}
            parts.append(self._prompt_segments(qkv[lo:], b[lo:], a[lo:], state, entries[decoding:], bounds, snapshots))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # (N, Hv, Dv)
        out = self.norm(out, z)  # (N, Hv, Dv)
        return self.out_proj(out.reshape(batch, steps, self.value_dim))

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``beta`` (write strength, activation dtype) and ``g`` (log decay, float32), ``(N, Hv)``."""
        return b.sigmoid(), -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)

    def _split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv output ``(N, C)`` as q, k ``(N, Hk, Dk)`` and v ``(N, Hv, Dv)``."""
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        n = mixed.shape[0]
        return (q.reshape(n, self.k_heads, self.k_dim), k.reshape(n, self.k_heads, self.k_dim),
                v.reshape(n, self.v_heads, self.v_dim))

    def _decode_rows(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, state: RecurrentState,
                     entries: torch.Tensor) -> torch.Tensor:
        """One token of each of ``Nd`` rows (``qkv`` ``(Nd, C)``), reading entries ``entries[:, 0]`` and
        writing ``entries[:, 1]``. Returns ``(Nd, Hv, Dv)``."""
        conv_pool, rec_pool = state.pools["conv"], state.pools["recurrent"]
        if use_triton(qkv):  # the kernels read and write the entries in place (strided table columns)
            from stagewise.kernels.deltanet_decode_triton import conv_step, delta_step

            mixed = conv_step(qkv, self.conv1d.weight, conv_pool, entries[:, 0], entries[:, 1])  # (Nd, C)
            return delta_step(mixed, b, a, self.A_log, self.dt_bias, rec_pool, entries[:, 0], entries[:, 1],
                              self.k_heads, self.k_dim)  # (Nd, Hv, Dv)
        read, write = entries[:, 0].long(), entries[:, 1].long()
        mixed = self._conv(qkv[:, None], conv_pool.index_select(0, read), conv_pool, write)[:, 0]  # (Nd, C)
        q, k, v = self._split_heads(mixed)
        beta, g = self._gates(b, a)
        out, recurrent = recurrent_gated_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                                    rec_pool.index_select(0, read))  # (Nd, 1, Hv, Dv)
        rec_pool.index_copy_(0, write, recurrent)
        return out[:, 0]

    def _conv(self, qkv: torch.Tensor, window: torch.Tensor, conv_pool: torch.Tensor,
              write: torch.Tensor) -> torch.Tensor:
        """Depthwise causal conv + SiLU of ``qkv`` ``(B, T, C)`` after ``window`` ``(B, C, K)`` (the K previous
        inputs); the last K inputs go to ``conv_pool[write]``. Returns ``(B, T, C)``."""
        window = torch.cat([window, qkv.transpose(1, 2)], dim=-1)  # (B, C, K + T)
        conv_pool.index_copy_(0, write, window[..., -self.kernel :])
        weight = self.conv1d.weight  # (C, 1, K)
        # output t sees inputs t+1 .. t+K of the window: the K-1 previous inputs and itself
        mixed = F.conv1d(window[..., 1:].to(weight.dtype), weight, groups=self.conv_dim)  # (B, C, T)
        return F.silu(mixed).to(qkv.dtype).transpose(1, 2)  # (B, T, C)

    def _prompt_segments(self, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, state: RecurrentState,
                         entries: torch.Tensor, bounds: list[int],
                         snapshots: dict[int, tuple[int, int]]) -> torch.Tensor:
        """Prompt chunks: segment ``s`` is tokens ``bounds[s] .. bounds[s+1] - 1`` of ``qkv`` ``(n, C)``, its
        state read from ``entries[s, 0]`` and written to ``entries[s, 1]``; ``snapshots[s] = (tokens, entry)``
        also writes its state after its first ``tokens`` tokens (a chunk boundary) to ``entry``.
        Returns ``(n, Hv, Dv)``."""
        conv_pool, rec_pool = state.pools["conv"], state.pools["recurrent"]
        outs = []
        for s in range(len(bounds) - 1):
            lo, hi = bounds[s], bounds[s + 1]
            read, write = entries[s : s + 1, 0].long(), entries[s : s + 1, 1].long()
            pieces = [(lo, hi, read, write)]
            if s in snapshots:
                tokens, entry = snapshots[s]
                snap = torch.full_like(read, entry)
                pieces = [(lo, lo + tokens, read, snap)] + ([(lo + tokens, hi, snap, write)] if lo + tokens < hi else [])
            for start, end, src, dst in pieces:
                mixed = self._conv(qkv[None, start:end], conv_pool.index_select(0, src), conv_pool, dst)[0]  # (n, C)
                q, k, v = self._split_heads(mixed)
                beta, g = self._gates(b[start:end], a[start:end])
                out, recurrent = chunked_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                                          rec_pool.index_select(0, src))  # (1, n, Hv, Dv)
                rec_pool.index_copy_(0, dst, recurrent)
                outs.append(out[0])
            if s in snapshots and lo + snapshots[s][0] == hi:  # the snapshot is the segment's final state
                for pool in (conv_pool, rec_pool):
                    pool.index_copy_(0, write, pool.index_select(0, pieces[0][3]))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
