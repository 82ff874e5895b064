"""Qwen3-MoE decoder blocks: Qwen3 attention (per-head q/k RMSNorm) + sparse MoE or dense SwiGLU.

A block is sparse when it is not in ``mlp_only_layers`` and ``(index + 1) % decoder_sparse_step == 0``
(:meth:`ModelConfig.block_is_moe`); otherwise it has a dense SwiGLU of ``intermediate_size``.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.models.layers.attention import Attention
from stagewise.models.layers.moe import SparseMoE
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.swiglu import SwiGLU
from stagewise.models.state import KVCache
from stagewise.models.step_context import StepContext
from stagewise.spec.model_config import ModelConfig


class Qwen3MoeBlock(nn.Module):
    """Pre-norm residual block: attention then the (sparse or dense) MLP."""

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, qk_norm=True)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (SparseMoE(config, shared_expert=False) if config.block_is_moe(index)
                               else SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias))

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        return self.self_attn.new_state(batch, max_context, dtype, device)

    def forward(self, hidden: torch.Tensor, ctx: StepContext, state: KVCache) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), ctx, state)  # (B, T, H)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def qwen3_moe_block(config: ModelConfig, index: int) -> nn.Module:
    return Qwen3MoeBlock(config, index)
