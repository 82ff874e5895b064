"""Grouped-query attention over a paged KV cache (the stage's block pool, read through its block table).

Options cover the families we run: per-head q/k RMSNorm (Qwen3, hybrids), partial rotary
embedding and a sigmoid output gate packed with the query projection (Qwen3-Next / Qwen3.5).
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.block_table import BlockTable
from stagewise.models.kv_cache import KVCache
from stagewise.models.layers.fused_linear import FusedGroups
from stagewise.models.layers.linear import Linear
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.rotary import apply_rotary
from stagewise.models.step_context import StepContext
from stagewise.spec.kv_pool import default_pool_blocks
from stagewise.spec.model_config import ModelConfig


class Attention(nn.Module):
    """Causal GQA; keeps checkpoint names ``q_proj``/``k_proj``/``v_proj``/``o_proj``/``q_norm``/``k_norm``."""

    def __init__(self, config: ModelConfig, qk_norm: bool, output_gate: bool = False) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.output_gate = output_gate
        hidden, bias = config.hidden_size, config.attention_bias
        q_out = self.heads * self.head_dim * (2 if output_gate else 1)  # query (+ gate)
        self.q_proj = Linear(hidden, q_out, bias)
        self.k_proj = Linear(hidden, self.kv_heads * self.head_dim, bias)
        self.v_proj = Linear(hidden, self.kv_heads * self.head_dim, bias)
        self.o_proj = Linear(self.heads * self.head_dim, hidden, bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.zero_centered_norm)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, config.zero_centered_norm)

        self.qkv_fused = FusedGroups()  # after fuse(): q, k and v as one matmul, or q and k with v apart
        # keys and values stored as this (None: the activation dtype; float8 e4m3: with per-head scales),
        # set by the stage before its state is made (the profile's kv_dtype)
        self.kv_storage: torch.dtype | None = None

    def fuse(self) -> None:
        """Replace q_proj + k_proj + v_proj by one matmul (after loading); where v's weight differs in kind (a
        Q4_K_M file's Q6_K ``attn_v`` beside Q4_K ``attn_q`` / ``attn_k``), q_proj + k_proj by one."""
        self.qkv_fused.fuse_parts(self._projections(), [[0, 1, 2], [0, 1]])

    def _projections(self) -> list[Linear]:
        return [self.q_proj, self.k_proj, self.v_proj]

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The step's projections of ``x`` ``(B, T, hidden)`` as the matmuls give them: the fused q/k/v output
        (one tensor), the fused q/k output and v, or q, k and v. Token by token: a packed step's graph pieces
        run it (:class:`~stagewise.runtime.packed_graphs.PackedGraphs`)."""
        return self.qkv_fused.project(x, self._projections())

    def _heads(self, projected: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                   torch.Tensor | None]:
        """``q`` ``(B, T, H, D)``, ``k``/``v`` ``(B, T, kvH, D)`` and the output gate ``(B, T, H, D)`` (or None),
        views of :meth:`project`'s outputs."""
        q_out, k_out, v_out = self.qkv_fused.split(projected, self._projections())
        batch, steps = q_out.shape[0], q_out.shape[1]
        gate_heads: torch.Tensor | None = None
        if self.output_gate:
            q_and_gate = q_out.reshape(batch, steps, self.heads, 2 * self.head_dim)
            q, gate_heads = torch.chunk(q_and_gate, 2, dim=-1)  # (B, T, H, D) each
        else:
            q = q_out.reshape(batch, steps, self.heads, self.head_dim)
        k = k_out.reshape(batch, steps, self.kv_heads, self.head_dim)
        v = v_out.reshape(batch, steps, self.kv_heads, self.head_dim)
        return q, k, v, gate_heads

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                  table: BlockTable | None = None, slots: object = None) -> KVCache:
        """This block's KV pool over ``table`` (the stage's); without one, its own identity table of
        ``batch`` rows of ``max_context`` positions."""
        if table is None:
            table = BlockTable(batch, max_context, default_pool_blocks(batch, max_context), device)
        return KVCache(table, self.kv_heads, self.head_dim, dtype, device, self.kv_storage)

    def forward(self, x: torch.Tensor, ctx: StepContext, cache: KVCache) -> torch.Tensor:
        return self.finish(self.attend(self.project(x), ctx, cache))

    def finish(self, attended: torch.Tensor) -> torch.Tensor:
        """The output projection of :meth:`attend`'s ``(B, T, H·D)``: token by token."""
        return self.o_proj(attended)

    def attend(self, projected: tuple[torch.Tensor, ...], ctx: StepContext, cache: KVCache,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Keys and values of :meth:`project`'s outputs stored, then every query attended over its row's
        keys (gated where the model gates): ``(B, T, H·D)``, the step's layout deciding how; a packed
        step's into ``out`` ``(N, 1, H·D)`` when given."""
        q, k, v, gate_heads = self._heads(projected)
        batch, steps = q.shape[0], q.shape[1]
        if ctx.layout is not None:
            return self._packed(q, k, v, gate_heads, ctx, cache, out)
        if use_triton(q):
            from stagewise.kernels.decode_attention_triton import decode_attention
            from stagewise.kernels.rope_store_triton import QKNorm, rope_store

            norm = None
            if self.q_norm is not None and self.k_norm is not None:  # normalized in the same launch
                norm = QKNorm(self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.q_norm.zero_centered)
            table = cache.table.table[ctx.rows]  # (B, blocks per row): this step's rows of the block table
            scales = _scales(cache)
            q = rope_store(q, k, v, ctx.inv_freq, ctx.positions, cache.key, cache.value, table, norm,
                           scales)  # (B, T, H, D)
            if steps == 1:  # decode: paged split-K attention over the pool (+ gate), each row's length read
                # from its position on the device: no mask tensor and no attended length (ctx.kv_length unused)
                return decode_attention(q, cache.key, cache.value, table, ctx.positions, gate_heads, scales)
            from stagewise.kernels.prefill_attention_triton import prefill_attention

            segments, rows, longest = ctx.prompt_segments  # a prompt chunk per row, over the paged pool
            gate = gate_heads.reshape(batch * steps, self.heads, self.head_dim) if gate_heads is not None else None
            attended = prefill_attention(q.reshape(batch * steps, self.heads, self.head_dim), cache.key, cache.value,
                                         cache.table.table, ctx.positions.reshape(-1), segments, rows, longest,
                                         scales=scales, gate=gate)  # gated in the same launch
            return attended.view(batch, steps, -1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        cos, sin = ctx.rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache.write(ctx.positions, k, v, ctx.start, ctx.rows)
        keys, values = cache.view(ctx.rows, ctx.kv_length)  # (B, kvH, L, D)
        return self._attend(q, keys, values, ctx.mask, gate_heads)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                gate_heads: torch.Tensor | None) -> torch.Tensor:
        """Attention of rotated queries ``q`` ``(B, H, T, D)`` over ``keys``/``values`` ``(B, kvH, L, D)``
        under ``mask`` ``(B, 1, G·T, L)``, times ``sigmoid(gate_heads)`` ``(B, T, H, D)``: ``(B, T, H·D)``."""
        batch, _, steps, _ = q.shape
        # grouped-query attention without repeating keys/values: the G query heads that share a
        # kv head become G * T query rows of that head (rows ordered group-major, then token)
        groups = self.heads // self.kv_heads
        rows = q.reshape(batch, self.kv_heads, groups * steps, self.head_dim)  # (B, kvH, G*T, D)
        # a key no query of the row sees (past its last position: a block's unwritten tail, another
        # sequence's leftovers) must weigh nothing, but a masked score is the product plus -inf and its
        # weight times the value: a NaN left there would come through both. Such keys and values are
        # zeroed first, as the kernels' masked loads never read them.
        unseen = ~mask.any(dim=2)[..., None]  # (B, 1, L, 1)
        keys, values = keys.masked_fill(unseen, 0.0), values.masked_fill(unseen, 0.0)
        out = nn.functional.scaled_dot_product_attention(rows, keys, values, attn_mask=mask)  # (B, kvH, G*T, D)
        out = out.reshape(batch, self.heads, steps, self.head_dim)  # (B, H, T, D)
        return self._gated(out.transpose(1, 2).reshape(batch, steps, self.heads * self.head_dim), gate_heads)

    @staticmethod
    def _gated(out: torch.Tensor, gate_heads: torch.Tensor | None) -> torch.Tensor:
        """``out`` ``(B, T, H·D)`` times ``sigmoid(gate_heads)`` (``(B, T, H, D)``) when there is a gate."""
        if gate_heads is None:
            return out
        return out * torch.sigmoid(gate_heads.reshape(out.shape))

    def _packed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate_heads: torch.Tensor | None,
                ctx: StepContext, cache: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        """A packed step (``ctx.layout``): ``q`` ``(N, 1, H, D)``, ``k``/``v`` ``(N, 1, kvH, D)``, one token a
        batch row, each of its segment's state row. Every token's key and value are written first,
        then the decoding rows' segments are attended as one decode batch and the later segments
        (prompts' chunks) each over its own row's positions, causally. Returns ``(N, 1, H·D)`` (``out`` when
        given)."""
        if use_triton(q):
            return self._packed_kernels(q, k, v, gate_heads, ctx, cache, out)
        layout = ctx.layout
        assert layout is not None
        token_rows = ctx.token_rows  # (N,)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = ctx.rotary  # (N, 1, rd)
        q = apply_rotary(q.transpose(1, 2), cos, sin).transpose(1, 2)  # (N, 1, H, D)
        k = apply_rotary(k.transpose(1, 2), cos, sin)  # (N, kvH, 1, D)
        cache.write(ctx.positions, k, v.transpose(1, 2), None, token_rows)
        offsets = layout.offsets
        decoding = layout.decoding
        parts: list[torch.Tensor] = []
        if decoding:
            hi = offsets[decoding]  # one token per row
            gate = gate_heads[:hi] if gate_heads is not None else None
            keys, values = cache.view(token_rows[:hi], max(layout.starts[:decoding]) + 1)  # (Nd, kvH, L, D)
            parts.append(self._attend(q[:hi].transpose(1, 2), keys, values, ctx.packed_masks[0], gate))
        for s in range(decoding, len(layout.rows)):
            lo, hi = offsets[s], offsets[s + 1]
            row, length = layout.rows[s], layout.starts[s] + layout.lengths[s]
            keys, values = cache.view(slice(row, row + 1), length)  # (1, kvH, L, D)
            seg = q[lo:hi].transpose(0, 1).transpose(1, 2)  # (1, H, n, D)
            mask = ctx.packed_masks[s - decoding + (1 if decoding else 0)]  # (1, 1, G*n, L)
            gate = gate_heads[lo:hi].transpose(0, 1) if gate_heads is not None else None  # (1, n, H, D)
            parts.append(self._attend(seg, keys, values, mask, gate).view(hi - lo, 1, -1))  # (n, 1, H*D)
        attended = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)  # (N, 1, H*D)
        return attended if out is None else out.copy_(attended)

    def _packed_kernels(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate_heads: torch.Tensor | None,
                        ctx: StepContext, cache: KVCache, out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`_packed` in three launches: keys and values stored (rope_store), every prompt chunk
        attended at once (prefill_attention), the decoding rows split-K (decode_attention); each gated in
        its attention's launch."""
        from stagewise.kernels.decode_attention_triton import decode_attention
        from stagewise.kernels.prefill_attention_triton import prefill_attention
        from stagewise.kernels.rope_store_triton import QKNorm, rope_store

        layout = ctx.layout
        assert layout is not None
        norm = None
        if self.q_norm is not None and self.k_norm is not None:
            norm = QKNorm(self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.q_norm.zero_centered)
        table = cache.table.table.index_select(0, ctx.token_rows)  # (N, blocks per row)
        scales = _scales(cache)
        q = rope_store(q, k, v, ctx.inv_freq, ctx.positions, cache.key, cache.value, table, norm,
                       scales)  # (N, 1, H, D)
        tokens, decoding = layout.tokens, layout.decoding
        if out is None:
            out = q.new_empty((tokens, 1, self.heads * self.head_dim))
        if decoding < len(layout.rows):
            segments, rows, longest = ctx.prompt_segments
            gate = gate_heads.reshape(tokens, self.heads, self.head_dim) if gate_heads is not None else None
            prefill_attention(q.view(tokens, self.heads, self.head_dim), cache.key, cache.value, cache.table.table,
                              ctx.positions.view(-1), segments, rows, longest,
                              out=out.view(tokens, self.heads, self.head_dim), scales=scales, gate=gate)
        if decoding:  # one token per row: split-K over each row's keys, as a decode step
            hi = layout.offsets[decoding]
            gate = gate_heads[:hi] if gate_heads is not None else None
            out[:hi] = decode_attention(q[:hi], cache.key, cache.value, table[:hi], ctx.positions[:hi], gate, scales)
        return out


def _scales(cache: KVCache) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fp8 cache's key and value scales for the kernels, or None for a cache in the activation dtype."""
    if cache.key_scale is None or cache.value_scale is None:
        return None
    return cache.key_scale, cache.value_scale
