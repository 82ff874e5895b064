"""Qwen3-MoE decoder blocks: Qwen3 attention (per-head q/k RMSNorm) + sparse MoE or dense SwiGLU.

A block is sparse when it is not in ``mlp_only_layers`` and ``(index + 1) % decoder_sparse_step == 0``
(:meth:`ModelConfig.block_is_moe`); otherwise it has a dense SwiGLU of ``intermediate_size``. The
block itself is the Llama/Qwen3 :class:`~stagewise.models.llama.DecoderBlock`.
"""

from __future__ import annotations

from torch import nn

from stagewise.models.layers.moe import SparseMoE
from stagewise.models.llama import DecoderBlock
from stagewise.spec.model_config import ModelConfig


def qwen3_moe_block(config: ModelConfig, index: int) -> nn.Module:
    mlp = SparseMoE(config, shared_expert=False) if config.block_is_moe(index) else None
    return DecoderBlock(config, qk_norm=True, mlp=mlp)
