"""Hybrid decoder blocks of Qwen3-Next, Qwen3.5 and Qwen3.5-MoE / Qwen3.6.

``layer_types`` picks each block's mixer: Gated DeltaNet linear attention (state: conv + fp32
recurrent, :class:`RecurrentState`) or gated full attention (per-head zero-centred q/k RMSNorm,
partial rotary, sigmoid output gate; state: :class:`KVCache`). The MLP is a sparse MoE with a
sigmoid-gated shared expert (Qwen3-Next, Qwen3.5-MoE) or a dense SwiGLU (Qwen3.5, and
Qwen3-Next's ``mlp_only_layers``). Block norms are zero-centred: ``y = x / rms(x) * (1 + w)``.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.models.block_table import BlockTable
from stagewise.models.kv_cache import KVCache
from stagewise.models.layers.attention import Attention
from stagewise.models.layers.gated_deltanet import GatedDeltaNet
from stagewise.models.layers.moe import SparseMoE
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.swiglu import SwiGLU
from stagewise.models.recurrent_state import RecurrentState
from stagewise.models.state import BlockState
from stagewise.models.state_slots import StateSlots
from stagewise.models.step_context import StepContext
from stagewise.spec.model_config import ModelConfig


class HybridBlock(nn.Module):
    """Pre-norm residual block: (linear or full) attention, then MoE or dense MLP."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.is_linear = config.block_is_linear(index)
        self.input_layernorm = RMSNorm(hidden, eps, zero_centered=True)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config, packed=config.architecture == "qwen3_next")
        else:
            self.self_attn = Attention(config, qk_norm=True, output_gate=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps, zero_centered=True)
        self.mlp: nn.Module = (SparseMoE(config, shared_expert=True) if config.block_is_moe(index)
                               else SwiGLU(hidden, config.intermediate_size))

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                  table: BlockTable | None = None, slots: StateSlots | None = None) -> BlockState:
        if self.is_linear:  # fixed-size entries addressed through the stage's slots: no KV blocks
            assert slots is not None, "a linear-attention block's state lives in its stage's state slots"
            return self.linear_attn.new_state(batch, max_context, dtype, device, slots)
        return self.self_attn.new_state(batch, max_context, dtype, device, table)

    def forward(self, hidden: torch.Tensor, ctx: StepContext, state: BlockState) -> torch.Tensor:
        carry = self.begin(hidden)
        return self.end(carry, self.mix(carry, ctx, state))

    def begin(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Token by token: ``hidden`` (the residual stream) and the mixer's input projections of its norm."""
        normed = self.input_layernorm(hidden)  # (B, T, H)
        mixer = self.linear_attn if self.is_linear else self.self_attn
        return (hidden, *mixer.project(normed))

    def mix(self, carry: tuple[torch.Tensor, ...], ctx: StepContext, state: BlockState,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """The mixer over the step's layout (its state read and written): (linear) attention's output
        before its output projection (into ``out`` when given)."""
        if self.is_linear:
            assert isinstance(state, RecurrentState)
            return self.linear_attn.mix(carry[1:], state, ctx, out)
        assert isinstance(state, KVCache)
        return self.self_attn.attend(carry[1:], ctx, state, out)

    def end(self, carry: tuple[torch.Tensor, ...], mixed: torch.Tensor) -> torch.Tensor:
        """Token by token: the mixer's output projection, the residual add, the MLP."""
        if self.is_linear:
            out = self.linear_attn.finish(mixed, carry[1:])
        else:
            out = self.self_attn.finish(mixed)
        hidden, normed = self.post_attention_layernorm.add_forward(carry[0], out)  # residual add + norm
        return self.mlp(normed, residual=hidden)  # the MLP's last launch adds the residual


def hybrid_block(config: ModelConfig, index: int) -> nn.Module:
    return HybridBlock(config, index)
