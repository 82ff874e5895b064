"""GGUF metadata -> :class:`ModelConfig`, converted once at the edge.

Keys are llama.cpp's (``gguf.constants.Keys``), for the architectures in
:data:`~stagewise.weights.gguf_names.GGUF_ARCHITECTURES`. What the metadata does not carry is
derived as llama.cpp derives it: the vocabulary from the token list or the embedding's shape,
``block_count`` minus the MTP (``nextn_predict_layers``) blocks, hybrid layer types from
``full_attention_interval``, Llama 3 rope scaling from the ``rope_freqs`` factors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gguf.constants import Keys

from stagewise.errors import ConfigError, UnsupportedArchitecture
from stagewise.spec.config_fields import MAX_DIM, MAX_EXPERTS, MAX_LAYERS
from stagewise.spec.model_config import (
    FULL_ATTENTION,
    HYBRID_ARCHITECTURES,
    MOE_ARCHITECTURES,
    ModelConfig,
    RopeScaling,
    layer_types_for_interval,
)
from stagewise.weights.gguf_names import GGUF_ARCHITECTURES

RopeFactors = Callable[[], Sequence[float] | None]


def gguf_family(fields: dict[str, Any], label: str) -> tuple[str, str]:
    """(llama.cpp architecture, our family) named by ``general.architecture``."""
    arch = fields.get(Keys.General.ARCHITECTURE)
    if arch is None:
        raise ConfigError(f"{label}: missing GGUF field {Keys.General.ARCHITECTURE}")
    if not isinstance(arch, str):
        raise ConfigError(f"{label}: GGUF field {Keys.General.ARCHITECTURE} must be a string, got {type(arch).__name__}")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{label}: GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(GGUF_ARCHITECTURES))})"
        )
    return str(arch), GGUF_ARCHITECTURES[arch]


def config_from_gguf(fields: dict[str, Any], label: str, embedding_shape: tuple[int, ...] | None = None,
                     rope_factors: RopeFactors | None = None, has_output: bool = True,
                     blocks_present: int | None = None) -> ModelConfig:
    """Normalize GGUF metadata into a :class:`ModelConfig`.

    Args:
        fields: GGUF key -> plain Python value.
        label: the file, for messages.
        embedding_shape: ``token_embd.weight``'s (vocab, hidden) shape, used when no vocab size is stated.
        rope_factors: returns the ``rope_freqs.weight`` values if the file has them (Llama 3 rope).
        has_output: the file has ``output.weight``; without it the LM head is tied to the embedding.
        blocks_present: one more than the highest ``blk.<i>`` index among the file's tensors; when given,
            ``block_count`` must agree with it (checked before anything is sized by ``block_count``).
    Raises:
        ConfigError: a required field is missing or has the wrong type.
        UnsupportedArchitecture: ``general.architecture`` is not one we run.
    """
    arch, family = gguf_family(fields, label)

    def get(key: str, kind: type = int, default: Any = None, lo: int = 0, hi: int = MAX_DIM) -> Any:
        """The field, type-checked, and for integers in ``[lo, hi]`` (so nothing is sized by a wild value)."""
        full = key.format(arch=arch)
        value = fields.get(full, default)
        if value is None:
            raise ConfigError(f"{label}: missing GGUF field {full}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{label}: GGUF field {full} must be an integer, got {_shown(value)}")
        if kind is int and not lo <= value <= hi and full != Keys.LLM.BLOCK_COUNT.format(arch=arch):
            raise ConfigError(f"{label}: GGUF field {full} must be in [{lo}, {hi}], got {value}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{label}: GGUF field {full} must be a number, got {_shown(value)}")
        return value

    block_count = get(Keys.LLM.BLOCK_COUNT)
    nextn = get(Keys.LLM.NEXTN_PREDICT_LAYERS, default=0, hi=MAX_LAYERS)
    if not 0 <= nextn < block_count:
        raise ConfigError(f"{label}: GGUF field {arch}.block_count {block_count} with {nextn} next-n blocks leaves no layers")
    layers = block_count - nextn
    # NOTE: checked first, so a corrupt count (2**31) is refused before anything is sized by it.
    if blocks_present is not None and not layers <= blocks_present <= block_count:
        raise ConfigError(
            f"{label}: GGUF field {arch}.block_count is {block_count} ({nextn} next-n), "
            f"but the file holds tensors for {blocks_present} blocks"
        )
    if layers > MAX_LAYERS:
        raise ConfigError(f"{label}: GGUF field {arch}.block_count {block_count} is beyond {MAX_LAYERS}")
    hidden = get(Keys.LLM.EMBEDDING_LENGTH, lo=1)
    heads = get(Keys.Attention.HEAD_COUNT, lo=1)
    kv_heads = get(Keys.Attention.HEAD_COUNT_KV, default=heads, lo=1)
    if not isinstance(heads, int) or heads <= 0:
        raise ConfigError(f"{label}: GGUF field {Keys.Attention.HEAD_COUNT.format(arch=arch)} must be positive")
    head_dim = get(Keys.Attention.KEY_LENGTH, default=hidden // heads if heads else 0)
    rotary = get(Keys.Rope.DIMENSION_COUNT, default=head_dim)
    value_length = get(Keys.Attention.VALUE_LENGTH, default=head_dim)
    if value_length != head_dim:
        raise ConfigError(f"{label}: attention value_length {value_length} differs from key_length {head_dim} "
                          "(not supported)")
    theta = _f32_decimal(get(Keys.Rope.FREQ_BASE, float, default=10000.0))
    eps = _f32_decimal(get(Keys.Attention.LAYERNORM_RMS_EPS, float, default=1e-6))
    if not (math.isfinite(eps) and eps > 0 and math.isfinite(theta) and theta > 0):
        raise ConfigError(f"{label}: rms epsilon {eps!r} and rope base {theta!r} must be finite and positive")
    vocab = fields.get(Keys.LLM.VOCAB_SIZE.format(arch=arch))
    if vocab is None and embedding_shape is not None:
        vocab = embedding_shape[0]
    if vocab is None and isinstance(fields.get(Keys.Tokenizer.LIST), list):
        vocab = len(fields[Keys.Tokenizer.LIST])
    if vocab is None:
        raise ConfigError(f"{label}: no vocabulary size (no {Keys.LLM.VOCAB_SIZE.format(arch=arch)}, no token_embd)")
    if not isinstance(head_dim, int) or head_dim <= 0 or not isinstance(rotary, int) or not 0 < rotary <= head_dim:
        raise ConfigError(f"{label}: rope dimension {rotary!r} does not fit head dimension {head_dim!r}")
    rope = _rope(arch, fields, label, theta, rotary / head_dim, head_dim, rope_factors)

    hybrid = family in HYBRID_ARCHITECTURES
    if hybrid:
        interval = get(Keys.LLM.FULL_ATTENTION_INTERVAL, default=4, hi=MAX_LAYERS)
        if interval <= 0:
            raise ConfigError(f"{label}: full_attention_interval must be positive, got {interval}")
        layer_types = layer_types_for_interval(interval, layers)
    else:
        layer_types = tuple(FULL_ATTENTION for _ in range(max(layers, 0)))
    moe = family in MOE_ARCHITECTURES
    extra: dict[str, Any] = {"gguf_architecture": arch}
    if nextn:
        extra["num_nextn_predict_layers"] = nextn
    kwargs: dict[str, Any] = {}
    if moe:
        kwargs.update(
            num_experts=get(Keys.LLM.EXPERT_COUNT, hi=MAX_EXPERTS),
            num_experts_per_tok=get(Keys.LLM.EXPERT_USED_COUNT, hi=MAX_EXPERTS),
            moe_intermediate_size=get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH),
            shared_expert_intermediate_size=get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, default=0),
        )
    if hybrid:
        value_heads = get(Keys.SSM.TIME_STEP_RANK)
        inner = get(Keys.SSM.INNER_SIZE)
        if value_heads <= 0 or inner % value_heads:
            raise ConfigError(f"{label}: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {value_heads}")
        kwargs.update(
            linear_conv_kernel_dim=get(Keys.SSM.CONV_KERNEL, hi=1024),
            linear_key_head_dim=get(Keys.SSM.STATE_SIZE),
            linear_num_key_heads=get(Keys.SSM.GROUP_COUNT),
            linear_num_value_heads=value_heads,
            linear_value_head_dim=inner // value_heads,
        )
    ffn = get(Keys.LLM.FEED_FORWARD_LENGTH, default=0)
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 0 < vocab <= MAX_DIM:
        raise ConfigError(f"{label}: vocabulary size must be an integer in [1, {MAX_DIM}], got {_shown(vocab)}")
    bos = fields.get(Keys.Tokenizer.BOS_ID)
    eos = fields.get(Keys.Tokenizer.EOS_ID)
    eos_ids = tuple(int(fields[k]) for k in (Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID) if isinstance(fields.get(k), int))
    if any(not 0 <= i < vocab for i in eos_ids) or (isinstance(bos, int) and not 0 <= bos < vocab):
        raise ConfigError(f"{label}: GGUF token ids bos {bos} / eos {eos_ids} must be in [0, {vocab})")
    try:
        return ModelConfig(
            architecture=family,
            vocab_size=vocab,
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=ffn if isinstance(ffn, int) else 0,
            rms_norm_eps=eps,
            rope=rope,
            max_position_embeddings=get(Keys.LLM.CONTEXT_LENGTH, default=4096, lo=1),
            tie_word_embeddings=not has_output,
            layer_types=layer_types,
            bos_token_id=bos if isinstance(bos, int) else None,
            eos_token_ids=tuple(dict.fromkeys(eos_ids)) if eos is not None else (),
            extra=extra,
            **kwargs,
        )
    except ConfigError as exc:  # ModelConfig's own checks do not name the file
        raise ConfigError(f"{label}: {exc}") from None


def _shown(value: Any) -> str:
    """A metadata value as messages show it: short scalars as they are, anything else by its kind."""
    text = repr(value)
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _f32_decimal(value: float) -> float:
    # GGUF stores these as float32: 1e-5 reads back as 9.99999974e-06. Take the shortest decimal that
    # rounds to the same float32 (what the HF config said), so configs from both formats compare equal.
    return float(str(np.float32(value)))


def _rope(arch: str, fields: dict[str, Any], label: str, theta: float, partial: float, head_dim: int,
          rope_factors: RopeFactors | None) -> RopeScaling:
    factors = rope_factors() if rope_factors is not None else None
    if factors is None:
        return RopeScaling(theta=theta, partial_rotary_factor=partial)
    # Llama 3.x: the converter folds rope scaling into per-frequency factors; recover the parameters
    # and check they reproduce every factor (the reference's own formula); any other factors are
    # applied as given, as llama.cpp does.
    original = fields.get(f"{arch}.rope.scaling.original_context_length", 8192)
    if isinstance(original, bool) or not isinstance(original, int) or not 0 < original <= MAX_DIM:
        raise ConfigError(f"{label}: GGUF field {arch}.rope.scaling.original_context_length must be an integer "
                          f"in [1, {MAX_DIM}], got {_shown(original)}")
    factor = float(max(factors))
    rope = RopeScaling(rope_type="llama3", theta=theta, factor=factor, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=int(original), partial_rotary_factor=partial)
    expected = llama3_rope_factors(rope, head_dim)
    if len(expected) != len(factors) or any(
        not math.isclose(a, b, rel_tol=1e-5) for a, b in zip(expected, factors, strict=False)
    ):
        if not all(math.isfinite(f) and f > 0 for f in factors):
            raise ConfigError(f"{label}: tensor 'rope_freqs.weight' holds factors that are not finite and > 0")
        if len(factors) != int(head_dim * partial) // 2:
            raise ConfigError(f"{label}: tensor 'rope_freqs.weight' holds {len(factors)} factors for "
                              f"{int(head_dim * partial) // 2} rotary frequencies")
        return RopeScaling(rope_type="factors", theta=theta, partial_rotary_factor=partial,
                           freq_factors=tuple(float(f) for f in factors))
    return rope


def llama3_rope_factors(rope: RopeScaling, head_dim: int) -> list[float]:
    """The per-frequency divisors llama.cpp's converter writes as ``rope_freqs.weight`` (float64 math)."""
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / (rope.theta ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(rope.factor)
        else:
            smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
                rope.high_freq_factor - rope.low_freq_factor
            )
            out.append(1 / ((1 - smooth) / rope.factor + smooth))
    return out
