"""ModelConfig: one normalized description of a decoder-only model's geometry.

Outside formats (a Hugging Face config.json, GGUF metadata) are converted once, here or in the
weights readers, into this frozen dataclass; nothing downstream reads them raw. No torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagewise.errors import ConfigError, ModelNotFound, UnsupportedArchitecture

# model_type (HF) -> our architecture family name
_HF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
HYBRID_ARCHITECTURES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe"})
MOE_ARCHITECTURES = frozenset({"qwen3_moe", "qwen3_next", "qwen3_5_moe"})
FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"


def layer_types_for_interval(interval: int, layers: int) -> tuple[str, ...]:
    """Hybrid pattern: every ``interval``-th block full attention, the others linear attention."""
    return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers))


@dataclass(frozen=True)
class RopeScaling:
    """Rotary embedding parameters: ``rope_type`` is ``default``, ``llama3``, or ``factors``: the
    per-frequency divisors ``freq_factors`` a GGUF file gives as ``rope_freqs.weight`` (llama.cpp
    divides each inverse frequency by its factor), used as given."""

    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    partial_rotary_factor: float = 1.0
    freq_factors: tuple[float, ...] = ()  # rope_type "factors" only

    def __post_init__(self) -> None:
        if self.rope_type not in ("default", "llama3", "factors"):
            raise ConfigError(f"rope_type {self.rope_type!r} is not supported (default, llama3, factors)")
        if (self.rope_type == "factors") != bool(self.freq_factors):
            raise ConfigError("rope freq_factors are given exactly when rope_type is 'factors'")
        if not all(math.isfinite(f) and f > 0 for f in self.freq_factors):
            raise ConfigError("rope freq_factors must be finite and > 0")
        if self.theta <= 0:
            raise ConfigError(f"rope_theta must be > 0, got {self.theta}")
        if not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor}")


@dataclass(frozen=True)
class ModelConfig:
    """Normalized geometry of one model; every field in model units (counts, not bytes)."""

    architecture: str  # one of _HF_ARCHITECTURES' values
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    layer_types: tuple[str, ...] = ()  # per block: full_attention | linear_attention
    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    # Gated DeltaNet (linear attention)
    linear_conv_kernel_dim: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    # tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.architecture not in set(_HF_ARCHITECTURES.values()):
            raise UnsupportedArchitecture(f"architecture {self.architecture!r} is not supported")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0 or value > 1 << 24:
                raise ConfigError(f"{name} must be a positive integer below 2**24, got {value!r}")
        if self.num_attention_heads % self.num_kv_heads != 0:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if len(self.layer_types) != self.num_layers:
            raise ConfigError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        for kind in self.layer_types:
            if kind not in (FULL_ATTENTION, LINEAR_ATTENTION):
                raise ConfigError(f"layer type {kind!r} is not supported")
        if self.is_moe and (self.num_experts <= 0 or not 0 < self.num_experts_per_tok <= self.num_experts):
            raise ConfigError(
                f"MoE needs 0 < num_experts_per_tok <= num_experts, got {self.num_experts_per_tok}/{self.num_experts}"
            )
        if LINEAR_ATTENTION in self.layer_types:
            dims = (self.linear_conv_kernel_dim, self.linear_key_head_dim, self.linear_value_head_dim,
                    self.linear_num_key_heads, self.linear_num_value_heads)
            if min(dims) <= 0:
                raise ConfigError(f"linear attention needs positive linear_* dimensions, got {dims}")
            if self.linear_num_value_heads % self.linear_num_key_heads != 0:
                raise ConfigError(
                    f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                    f"linear_num_key_heads ({self.linear_num_key_heads})"
                )

    @property
    def is_moe(self) -> bool:
        return self.architecture in MOE_ARCHITECTURES

    @property
    def is_hybrid(self) -> bool:
        return self.architecture in HYBRID_ARCHITECTURES

    def block_is_linear(self, index: int) -> bool:
        """True if block ``index`` uses Gated DeltaNet linear attention."""
        return self.layer_types[index] == LINEAR_ATTENTION

    def block_is_moe(self, index: int) -> bool:
        """True if block ``index`` has a mixture-of-experts MLP (else dense SwiGLU)."""
        if not self.is_moe:
            return False
        if index in self.mlp_only_layers:
            return False
        return (index + 1) % max(self.decoder_sparse_step, 1) == 0

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim  # q + k + v channels

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rope.partial_rotary_factor)

    @property
    def attn_output_gate(self) -> bool:
        """Hybrid families gate the full-attention output with a sigmoid of a second q projection."""
        return self.is_hybrid

    @property
    def zero_centered_norm(self) -> bool:
        """Hybrid families store RMSNorm weights as offsets from 1 (y = x * (1 + w))."""
        return self.is_hybrid

    @staticmethod
    def from_hf_dict(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Normalize a Hugging Face config dict (transformers 4.x or 5.x field names)."""
        return _from_hf(raw, source)

    @staticmethod
    def from_path(path: str | Path) -> ModelConfig:
        """Read a config.json file, or the config.json inside a model directory."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise ModelNotFound(f"{p}: no config.json found")
        try:
            raw = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{p}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: top level must be a JSON object")
        return _from_hf(raw, str(p))


def _req(raw: dict[str, Any], key: str, source: str, kind: type = int) -> Any:
    if key not in raw or raw[key] is None:
        raise ConfigError(f"{source}: missing field {key!r}")
    value = raw[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{source}: field {key!r} must be an integer, got {value!r}")
    if kind is float and not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: field {key!r} must be a number, got {value!r}")
    return value


def _rope(raw: dict[str, Any], source: str, default_partial: float = 1.0) -> RopeScaling:
    params = raw.get("rope_parameters") or {}
    legacy = raw.get("rope_scaling") or {}
    merged: dict[str, Any] = {**legacy, **params}
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    theta = merged.get("rope_theta", raw.get("rope_theta", 10000.0))
    partial = merged.get("partial_rotary_factor", raw.get("partial_rotary_factor", default_partial))
    try:
        return RopeScaling(
            rope_type=str(rope_type),
            theta=float(theta),
            factor=float(merged.get("factor", 1.0)),
            low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
            high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
            partial_rotary_factor=float(partial),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: bad rope parameters ({exc})") from None


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _from_hf(raw: dict[str, Any], source: str) -> ModelConfig:
    model_type = raw.get("model_type")
    if model_type is None:
        raise ConfigError(f"{source}: missing field 'model_type'")
    if model_type not in _HF_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{source}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(sorted(_HF_ARCHITECTURES))})"
        )
    outer = raw
    if isinstance(raw.get("text_config"), dict):
        raw = {**raw["text_config"]}
        raw.setdefault("tie_word_embeddings", outer.get("tie_word_embeddings", False))
    arch = _HF_ARCHITECTURES[model_type]
    hidden = _req(raw, "hidden_size", source)
    heads = _req(raw, "num_attention_heads", source)
    layers = _req(raw, "num_hidden_layers", source)
    head_dim = raw.get("head_dim") or (hidden // heads if heads else 0)
    kv_heads = raw.get("num_key_value_heads") or heads
    layer_types: list[str] = list(raw.get("layer_types") or ())
    if arch in HYBRID_ARCHITECTURES and not layer_types:
        interval = int(raw.get("full_attention_interval", 4))
        layer_types = list(layer_types_for_interval(interval, layers))
    if arch not in HYBRID_ARCHITECTURES:
        layer_types = [FULL_ATTENTION] * layers
    num_experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise UnsupportedArchitecture(f"{source}: hidden_act {activation!r} is not supported (silu)")
    # Qwen3.5-MoE has no dense layers and always renormalizes its top-k router weights.
    sparse_only = arch == "qwen3_5_moe"
    extra: dict[str, Any] = {k: raw[k] for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers") if k in raw}
    if "vision_config" in outer:
        extra["has_vision"] = True
    return ModelConfig(
        architecture=arch,
        vocab_size=_req(raw, "vocab_size", source),
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(raw.get("intermediate_size") or 0),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        # hybrid configs default to rotating a quarter of each head (transformers' default)
        rope=_rope(raw, source, 0.25 if arch in HYBRID_ARCHITECTURES else 1.0),
        max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        layer_types=tuple(layer_types),
        num_experts=num_experts,
        num_experts_per_tok=int(raw.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
        norm_topk_prob=True if sparse_only else bool(raw.get("norm_topk_prob", True)),
        decoder_sparse_step=1 if sparse_only else int(raw.get("decoder_sparse_step", 1) or 1),
        mlp_only_layers=() if sparse_only else tuple(int(i) for i in raw.get("mlp_only_layers") or ()),
        shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
        linear_conv_kernel_dim=int(raw.get("linear_conv_kernel_dim") or 0),
        linear_key_head_dim=int(raw.get("linear_key_head_dim") or 0),
        linear_value_head_dim=int(raw.get("linear_value_head_dim") or 0),
        linear_num_key_heads=int(raw.get("linear_num_key_heads") or 0),
        linear_num_value_heads=int(raw.get("linear_num_value_heads") or 0),
        bos_token_id=raw.get("bos_token_id") if isinstance(raw.get("bos_token_id"), int) else None,
        eos_token_ids=_eos(raw.get("eos_token_id")),
        extra=extra,
    )
