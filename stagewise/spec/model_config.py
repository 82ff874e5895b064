"""ModelConfig: one normalized description of a decoder-only model's geometry.

Outside formats (a Hugging Face config.json, GGUF metadata) are converted once, here or in the
weights readers, into this frozen dataclass; nothing downstream reads them raw. No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagewise.errors import ConfigError, ModelNotFound, UnsupportedArchitecture
from stagewise.spec.config_fields import MAX_DIM, MAX_EXPERTS, MAX_LAYERS, ConfigFields, read_json_object

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
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM:
                raise ConfigError(f"{name} must be a positive integer up to 2**24, got {value!r}")
        if not 0 < self.num_layers <= MAX_LAYERS:
            raise ConfigError(f"num_layers must be in [1, {MAX_LAYERS}], got {self.num_layers}")
        if not (math.isfinite(self.rms_norm_eps) and 0 < self.rms_norm_eps <= 1):
            raise ConfigError(f"rms_norm_eps must be a finite number in (0, 1], got {self.rms_norm_eps!r}")
        if any(not 0 <= i < self.vocab_size for i in (*self.eos_token_ids, *(
                () if self.bos_token_id is None else (self.bos_token_id,)))):
            raise ConfigError(f"bos/eos token ids must be in [0, {self.vocab_size}), got "
                              f"{self.bos_token_id} / {self.eos_token_ids}")
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
        return _from_hf(read_json_object(p), str(p))


def _rope(fields: ConfigFields, source: str, default_partial: float = 1.0) -> RopeScaling:
    params = fields.object_("rope_parameters")
    legacy = fields.object_("rope_scaling")
    # rope_theta and partial_rotary_factor may sit at the top level (transformers 4.x) or in the dict (5.x)
    merged = ConfigFields({k: v for k, v in fields.raw.items() if k in ("rope_theta", "partial_rotary_factor")}
                          | legacy | params, f"{source} rope parameters")
    rope_type = merged.str_("rope_type", "") or merged.str_("type", "default")
    return RopeScaling(
        rope_type=rope_type,
        theta=merged.float_("rope_theta", 10000.0, hi=1e12),
        factor=merged.float_("factor", 1.0, hi=1e6),
        low_freq_factor=merged.float_("low_freq_factor", 1.0, hi=1e6),
        high_freq_factor=merged.float_("high_freq_factor", 4.0, hi=1e6),
        original_max_position_embeddings=merged.int_("original_max_position_embeddings", 8192, lo=1),
        partial_rotary_factor=merged.float_("partial_rotary_factor", default_partial, hi=1.0),
    )


def _from_hf(raw: dict[str, Any], source: str) -> ModelConfig:
    try:
        return _read_hf(raw, source)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(source) else f"{source}: {message}") from None


def _read_hf(raw: dict[str, Any], source: str) -> ModelConfig:
    """Every field the models read, type- and range-checked before anything is sized by it."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise ConfigError(f"{source}: missing field 'model_type'")
    if not isinstance(model_type, str) or model_type not in _HF_ARCHITECTURES:
        shown = repr(model_type) if isinstance(model_type, str) and len(model_type) <= 40 else "that value"
        raise UnsupportedArchitecture(
            f"{source}: model_type {shown} is not supported (supported: {', '.join(sorted(_HF_ARCHITECTURES))})"
        )
    outer = ConfigFields(raw, source)
    tie_outer = outer.bool_("tie_word_embeddings", False)
    text_config = raw.get("text_config")
    if text_config is not None and not isinstance(text_config, dict):
        raise ConfigError(f"{source}: field 'text_config' must be a JSON object")
    f = ConfigFields({"tie_word_embeddings": tie_outer, **text_config} if text_config else raw, source)
    arch = _HF_ARCHITECTURES[model_type]
    hidden = f.int_("hidden_size", lo=1)
    heads = f.int_("num_attention_heads", lo=1)
    layers = f.int_("num_hidden_layers", lo=1, hi=MAX_LAYERS)
    vocab = f.int_("vocab_size", lo=1)
    head_dim = f.int_("head_dim", hidden // heads, lo=1) if f.raw.get("head_dim") != 0 else hidden // heads
    kv_heads = f.int_("num_key_value_heads", heads, lo=1) if f.raw.get("num_key_value_heads") != 0 else heads
    hybrid = arch in HYBRID_ARCHITECTURES
    if hybrid:
        layer_types = f.str_list("layer_types", MAX_LAYERS) or layer_types_for_interval(
            f.int_("full_attention_interval", 4, lo=1, hi=layers), layers)
    else:
        layer_types = (FULL_ATTENTION,) * layers
    num_experts = f.int_("num_experts", 0, hi=MAX_EXPERTS) or f.int_("num_local_experts", 0, hi=MAX_EXPERTS)
    activation = f.str_("hidden_act", "silu")
    if activation != "silu":
        raise UnsupportedArchitecture(f"{source}: hidden_act {activation!r} is not supported (silu)")
    # Qwen3.5-MoE has no dense layers and always renormalizes its top-k router weights.
    sparse_only = arch == "qwen3_5_moe"
    extra: dict[str, Any] = {k: f.int_(k, 0, hi=MAX_LAYERS) for k in ("mtp_num_hidden_layers", "num_nextn_predict_layers")
                             if k in f.raw}
    if "vision_config" in raw:
        extra["has_vision"] = True
    bos = f.int_("bos_token_id", -1, lo=0, hi=vocab - 1) if f.present("bos_token_id") else None
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=f.int_("intermediate_size", 0),
        rms_norm_eps=f.float_("rms_norm_eps", 1e-6, hi=1.0),
        # hybrid configs default to rotating a quarter of each head (transformers' default)
        rope=_rope(f, source, 0.25 if hybrid else 1.0),
        max_position_embeddings=f.int_("max_position_embeddings", 4096, lo=1),
        tie_word_embeddings=f.bool_("tie_word_embeddings", False),
        attention_bias=f.bool_("attention_bias", False),
        mlp_bias=f.bool_("mlp_bias", False),
        layer_types=tuple(layer_types),
        num_experts=num_experts,
        num_experts_per_tok=f.int_("num_experts_per_tok", 0, hi=MAX_EXPERTS),
        moe_intermediate_size=f.int_("moe_intermediate_size", 0),
        norm_topk_prob=True if sparse_only else f.bool_("norm_topk_prob", True),
        decoder_sparse_step=1 if sparse_only else (f.int_("decoder_sparse_step", 1, hi=layers) or 1),
        mlp_only_layers=() if sparse_only else f.int_list("mlp_only_layers", 0, layers - 1, layers),
        shared_expert_intermediate_size=f.int_("shared_expert_intermediate_size", 0),
        linear_conv_kernel_dim=f.int_("linear_conv_kernel_dim", 0, hi=1024),
        linear_key_head_dim=f.int_("linear_key_head_dim", 0),
        linear_value_head_dim=f.int_("linear_value_head_dim", 0),
        linear_num_key_heads=f.int_("linear_num_key_heads", 0),
        linear_num_value_heads=f.int_("linear_num_value_heads", 0),
        bos_token_id=bos,
        eos_token_ids=f.int_list("eos_token_id", 0, vocab - 1, 64, scalar_ok=True),
        extra=extra,
    )
