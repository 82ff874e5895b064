"""Llama 2 / 3 / 3.1 and Qwen3 decoder blocks (Qwen3 adds per-head q/k RMSNorm)."""

from __future__ import annotations

import torch
from torch import nn

from stagewise.models.block_table import BlockTable
from stagewise.models.kv_cache import KVCache
from stagewise.models.layers.attention import Attention
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.swiglu import SwiGLU
from stagewise.models.step_context import StepContext
from stagewise.spec.model_config import ModelConfig


class DecoderBlock(nn.Module):
    """Pre-norm residual block: attention then the MLP (SwiGLU unless another is given, e.g. a MoE)."""

    def __init__(self, config: ModelConfig, qk_norm: bool, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, qk_norm=qk_norm)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = mlp if mlp is not None else SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)

    def new_state(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                  table: BlockTable | None = None, slots: object = None) -> KVCache:
        return self.self_attn.new_state(batch, max_context, dtype, device, table)

    def forward(self, hidden: torch.Tensor, ctx: StepContext, state: KVCache) -> torch.Tensor:
        carry = self.begin(hidden)
        return self.end(carry, self.mix(carry, ctx, state))

    def begin(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Token by token: ``hidden`` (the residual stream) and the q/k/v projections of its norm."""
        return (hidden, *self.self_attn.project(self.input_layernorm(hidden)))

    def mix(self, carry: tuple[torch.Tensor, ...], ctx: StepContext, state: KVCache,
            out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the step's layout, before its output projection (into ``out`` when given)."""
        return self.self_attn.attend(carry[1:], ctx, state, out)

    def end(self, carry: tuple[torch.Tensor, ...], mixed: torch.Tensor) -> torch.Tensor:
        """Token by token: the output projection, the residual add, the MLP."""
        hidden, normed = self.post_attention_layernorm.add_forward(carry[0], self.self_attn.finish(mixed))
        return self.mlp(normed, residual=hidden)  # the MLP's last launch adds the residual


def llama_block(config: ModelConfig, index: int) -> nn.Module:
    return DecoderBlock(config, qk_norm=False)


def qwen3_block(config: ModelConfig, index: int) -> nn.Module:
    return DecoderBlock(config, qk_norm=True)
