"""Small random-weight Qwen3-MoE / Qwen3-Next / Qwen3.5(-MoE) transformers models for exactness tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_ATTN = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=211)
_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12,
               linear_num_key_heads=2, linear_num_value_heads=4)
L, F = "linear_attention", "full_attention"

# name -> (family, config overrides)
HYBRID_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe-sparse": ("qwen3_moe", dict(
        _ATTN, num_hidden_layers=3, intermediate_size=96, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32)),
    "qwen3_moe-step2-mlponly-nonorm-tied": ("qwen3_moe", dict(
        hidden_size=48, num_attention_heads=6, num_key_value_heads=3, head_dim=8, vocab_size=199,
        num_hidden_layers=4, intermediate_size=80, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24,
        decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False, tie_word_embeddings=True)),
    "qwen3_next-default-pattern": ("qwen3_next", dict(
        _ATTN, **_LINEAR, num_hidden_layers=4, intermediate_size=96, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=40)),
    "qwen3_next-mixed-mlponly-partial-half": ("qwen3_next", dict(
        hidden_size=48, num_attention_heads=2, num_key_value_heads=1, head_dim=24, vocab_size=163,
        linear_conv_kernel_dim=3, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=3,
        linear_num_value_heads=3, num_hidden_layers=4, layer_types=[F, L, L, F], intermediate_size=64,
        num_experts=4, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        mlp_only_layers=[1], norm_topk_prob=False, partial_rotary_factor=0.5)),
    "qwen3_5-default-pattern": ("qwen3_5", dict(
        _ATTN, **_LINEAR, num_hidden_layers=4, intermediate_size=96)),
    "qwen3_5-tied-kernel3": ("qwen3_5", dict(
        hidden_size=40, num_attention_heads=5, num_key_value_heads=1, head_dim=16, vocab_size=151,
        linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=1,
        linear_num_value_heads=3, num_hidden_layers=3, layer_types=[L, F, L], intermediate_size=72,
        tie_word_embeddings=True)),
    "qwen3_5_moe-text": ("qwen3_5_moe", dict(
        _ATTN, **_LINEAR, num_hidden_layers=4, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24,
        shared_expert_intermediate_size=32)),
    "qwen3_5_moe-conditional": ("qwen3_5_moe_vl", dict(
        _ATTN, **_LINEAR, num_hidden_layers=4, layer_types=[L, F, L, F], num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=24, shared_expert_intermediate_size=16)),
    "qwen3_5-conditional": ("qwen3_5_vl", dict(
        _ATTN, **_LINEAR, num_hidden_layers=2, layer_types=[L, F], intermediate_size=64)),
}

_VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=64, patch_size=4,
               num_position_embeddings=16)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Move norms away from their init (so offset bugs show) and make routing decisive (no near-ties)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith("dt_bias"):
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
            elif name.endswith("mlp.gate.weight"):
                param.mul_(50.0)


def _build(family: str, overrides: dict[str, Any]) -> torch.nn.Module:
    import transformers

    common = dict(max_position_embeddings=256)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**common, **overrides))
    if family == "qwen3_next":
        return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**common, **overrides))
    if family == "qwen3_5":
        return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**common, **overrides))
    if family == "qwen3_5_moe":
        return transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**common, **overrides))
    if family == "qwen3_5_moe_vl":
        config = transformers.Qwen3_5MoeConfig(text_config={**common, **overrides}, vision_config=_VISION)
        return transformers.Qwen3_5MoeForConditionalGeneration(config)
    if family == "qwen3_5_vl":
        config = transformers.Qwen3_5Config(text_config={**common, **overrides}, vision_config=_VISION)
        return transformers.Qwen3_5ForConditionalGeneration(config)
    raise ValueError(family)


def make_hf_hybrid_model(name: str, out: Path, seed: int = 0) -> torch.nn.Module:
    """Build, perturb and save_pretrained case ``name``; returns the transformers model (float32, eval)."""
    family, overrides = HYBRID_CASES[name]
    torch.manual_seed(seed)
    model = _build(family, overrides)
    _perturb(model, seed)
    model.eval()
    model.save_pretrained(out)
    return model


def hf_linear_states(cache: Any, layer: int) -> dict[str, torch.Tensor]:
    """transformers' conv and recurrent state of linear-attention ``layer`` from a cache."""
    return {"conv": cache.get_conv_state(layer), "recurrent": cache.get_recurrent_state(layer)}
