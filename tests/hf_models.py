"""Small random-weight transformers models for the exactness tests (transformers is test-only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

LLAMA_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-gqa": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=211),
    "llama3-rope-tied": dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
                             num_key_value_heads=3, vocab_size=199, tie_word_embeddings=True,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                             rope_theta=500000.0),
    "llama-mha-odd": dict(hidden_size=60, intermediate_size=72, num_hidden_layers=2, num_attention_heads=5,
                          num_key_value_heads=5, vocab_size=157),
}
QWEN3_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-gqa": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=24, vocab_size=203),
    "qwen3-tied-odd": dict(hidden_size=56, intermediate_size=64, num_hidden_layers=2, num_attention_heads=7,
                           num_key_value_heads=1, head_dim=16, vocab_size=181, tie_word_embeddings=True),
}


def _perturb_norms(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)


def make_hf_model(family: str, overrides: dict[str, Any], out: Path, seed: int = 0) -> torch.nn.Module:
    """Build, perturb and save_pretrained a random model; returns the transformers model (float32)."""
    import transformers

    torch.manual_seed(seed)
    if family == "llama":
        config = transformers.LlamaConfig(max_position_embeddings=256, **overrides)
        model = transformers.LlamaForCausalLM(config)
    elif family == "qwen3":
        config = transformers.Qwen3Config(max_position_embeddings=256, **overrides)
        model = transformers.Qwen3ForCausalLM(config)
    else:
        raise ValueError(family)
    _perturb_norms(model, seed)
    model.eval()
    model.save_pretrained(out)
    return model
