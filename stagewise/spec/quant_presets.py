"""llama.cpp's per-tensor types for a quantization preset (``--format q4_k_m`` …), torch-free.

:func:`tensor_type` is ``llama_tensor_get_type`` of llama.cpp's ``src/llama-quant.cpp`` (the
2026 version, with tensor categories) for the presets below, keyed on GGUF tensor names
(``blk.N.attn_v.weight``, ``token_embd.weight``, ``output.weight``, ``blk.N.ffn_down_exps.weight``),
without an importance matrix:

* only tensors named ``*weight`` with two or more dimensions are quantized, and never norms,
  ``ffn_gate_inp`` (the router) or ``ssm_conv1d``; those keep the converter's F32;
* ``output.weight`` (and ``token_embd.weight`` when the head is tied) is Q6_K, or Q8_0 when its
  rows do not divide into the preset type's block or the preset is Q8_0 / MXFP4_MOE;
* Q4_K_M / Q5_K_M: ``attn_v`` / ``attn_qkv`` and ``ffn_down*`` of the "more bits" layers are Q6_K;
  Q3_K_M / Q2_K / IQ4_XS / Q4_K_S … have their own upgrades (see the code); a llama model of 80
  layers (llama.cpp's 70B) has its Q3_K / Q4_K ``attn_v`` at Q5_K; an 8-expert MoE its
  ``attn_v`` / ``attn_k`` at Q8_0;
* a row not divisible by the chosen type's block falls back: IQ4_XS -> IQ4_NL, Q2_K / Q3_K ->
  Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 (older llama.cpp chose IQ4_NL for
  Q2_K / Q3_K).

A plain type that is no llama.cpp file type (``q4_k``, ``q5_k``, ``q3_k``, ``mxfp4``, the IQ1-3
types) puts every quantizable tensor in that type except the output head, which follows the
output rule above; float formats (``bf16`` …) put every tensor in that dtype, as an HF
checkpoint holds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stagewise.errors import ConfigError
from stagewise.spec.model_config import ModelConfig

T = GGMLQuantizationType
_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Preset:
    """A ``--format``: the default tensor type and whether llama.cpp's mix rules apply (``mix``)."""

    name: str
    default: GGMLQuantizationType
    mix: bool  # a llama.cpp file type (LLAMA_FTYPE_MOSTLY_*): per-tensor upgrades apply

    @property
    def quantized(self) -> bool:
        return self.default not in (T.F32, T.F16, T.BF16)


@dataclass(frozen=True)
class QuantModel:
    """What llama.cpp's rules read from the model's hyperparameters."""

    num_layers: int
    n_gqa: int  # attention heads per key/value head
    n_expert: int
    is_70b: bool  # llama.cpp's LLM_TYPE_70B: a llama of 80 layers with grouped KV heads
    tied: bool  # no output.weight: token_embd takes the output rule

    @staticmethod
    def from_config(c: ModelConfig) -> QuantModel:
        gqa = c.num_attention_heads // c.num_kv_heads if c.num_kv_heads else 0
        is_70b = c.architecture == "llama" and c.num_layers == 80 and c.num_kv_heads != c.num_attention_heads
        return QuantModel(c.num_layers, gqa, c.num_experts if c.is_moe else 0, is_70b, c.tie_word_embeddings)


def _mix(name: str, default: GGMLQuantizationType) -> Preset:
    return Preset(name, default, True)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("f32", T.F32, False), Preset("f16", T.F16, False), Preset("bf16", T.BF16, False),
    _mix("q4_0", T.Q4_0), _mix("q4_1", T.Q4_1), _mix("q5_0", T.Q5_0), _mix("q5_1", T.Q5_1), _mix("q8_0", T.Q8_0),
    _mix("q2_k", T.Q2_K), _mix("q3_k_s", T.Q3_K), _mix("q3_k_m", T.Q3_K), _mix("q3_k_l", T.Q3_K),
    _mix("q4_k_s", T.Q4_K), _mix("q4_k_m", T.Q4_K), _mix("q5_k_s", T.Q5_K), _mix("q5_k_m", T.Q5_K),
    _mix("q6_k", T.Q6_K), _mix("iq4_nl", T.IQ4_NL), _mix("iq4_xs", T.IQ4_XS), _mix("mxfp4_moe", T.MXFP4),
    Preset("q3_k", T.Q3_K, False), Preset("q4_k", T.Q4_K, False), Preset("q5_k", T.Q5_K, False),
    Preset("mxfp4", T.MXFP4, False),
    *(Preset(t.name.lower(), t, False) for t in (T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS,
                                                 T.IQ3_S, T.TQ1_0, T.TQ2_0)),
)}
_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "fp32": "f32", "fp16": "f16"}
_FALLBACK = {T.IQ4_XS: T.IQ4_NL, T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL,
             T.IQ2_S: T.IQ4_NL, T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0,
             T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.MXFP4: T.Q8_0}


def preset(name: str) -> Preset:
    """The preset called ``name`` (case-insensitive; ``bfloat16`` etc. accepted)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in PRESETS:
        raise ConfigError(f"format {name!r} is not supported (supported: {', '.join(PRESETS)})")
    return PRESETS[key]


# GGUF tensors make-model stores F32 in every format (as llama.cpp's converter writes them), though llama-quantize
# would quantize ssm_alpha / ssm_beta of a converted file
KEEP_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight", "ssm_conv1d.weight", "ssm_ba.weight",
            "ssm_alpha.weight", "ssm_beta.weight", "rope_freqs.weight")


def quantizable(gguf_name: str, shape: tuple[int, ...]) -> bool:
    """llama.cpp's ``tensor_allows_quantization`` for the tensors of our families."""
    return (len(shape) >= 2 and gguf_name.endswith("weight") and "_norm.weight" not in gguf_name
            and "ffn_gate_inp.weight" not in gguf_name and "ssm_conv1d" not in gguf_name)


def tensor_type(fmt: Preset | str, gguf_name: str, shape: tuple[int, ...], model: QuantModel) -> GGMLQuantizationType:
    """The type llama.cpp's quantizer gives ``gguf_name`` of ``shape`` (torch order: the row last)
    in a ``fmt`` file of ``model``."""
    p = preset(fmt) if isinstance(fmt, str) else fmt
    if not p.quantized:
        return p.default
    if not quantizable(gguf_name, shape):
        return T.F32
    category = _category(gguf_name)
    if category == "output" or (model.tied and category == "token_embd"):
        chosen = _output_type(p, shape)
    elif p.mix:
        chosen = _mixed(p, category, gguf_name, model)
    else:
        chosen = p.default
    return _fallback(chosen, shape[-1])


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for part in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight", "attn_k.weight", "attn_q.weight",
                 "attn_output.weight", "ffn_up", "ffn_gate", "ffn_down"):
        if part in name:
            return part.removesuffix(".weight")
    return "other"


def _output_type(p: Preset, shape: tuple[int, ...]) -> GGMLQuantizationType:
    if p.name == "mxfp4_moe" or shape[-1] % GGML_QUANT_SIZES[p.default][0]:
        return T.Q8_0
    if p.default in (T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS):
        return T.Q5_K
    return p.default if p.default == T.Q8_0 else T.Q6_K


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _layer(name: str) -> int:
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else 0


def _mixed(p: Preset, category: str, name: str, m: QuantModel) -> GGMLQuantizationType:
    """``llama_tensor_get_type_impl`` for the file types of :data:`PRESETS` (no importance matrix).

    Every block of our families holds exactly one ``attn_v`` or ``attn_qkv`` and one set of
    ``ffn_*`` tensors, and llama.cpp visits tensors block by block, so its running counters
    (``i_attention_wv``, ``i_ffn_down``) equal the block index."""
    f, new = p.name, p.default
    i, n = _layer(name), m.num_layers
    if f == "mxfp4_moe":
        return T.MXFP4 if "_exps" in name else T.Q8_0  # experts are the only 3-D tensors
    if category == "token_embd":
        return new
    if category in ("attn_v", "attn_qkv", "attn_kv_b"):
        if f == "q2_k":
            new = T.Q4_K if m.n_gqa >= 4 else T.Q3_K
        elif f == "q3_k_m":
            new = T.Q5_K if i < 2 else T.Q4_K
        elif f == "q3_k_l":
            new = T.Q5_K
        elif f in ("iq4_nl", "iq4_xs") and m.n_gqa >= 4:
            new = T.Q5_K
        elif f in ("q4_k_m", "q5_k_m") and _more_bits(i, n):
            new = T.Q6_K
        elif f == "q4_k_s" and i < 4:
            new = T.Q5_K
        if m.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K  # 8 heads share one attn_v: more bits for almost no size
        if m.n_expert == 8:
            new = T.Q8_0
    elif category == "attn_k":
        if m.n_expert == 8:
            new = T.Q8_0
    elif category == "ffn_down":
        if f == "q2_k":
            new = T.Q3_K
        elif f == "q3_k_m":
            new = T.Q5_K if i < n // 16 else T.Q4_K
        elif f == "q3_k_l":
            new = T.Q5_K
        elif f == "q4_k_m":
            if _more_bits(i, n):
                new = T.Q6_K
        elif i < n // 8 and f in ("iq4_nl", "iq4_xs"):
            new = T.Q5_K
        elif f == "q5_k_m" and _more_bits(i, n):
            new = T.Q6_K
        elif f == "q4_k_s" and i < n // 8:
            new = T.Q5_K
    elif category == "attn_output":
        if m.n_expert == 8:
            if f in ("q2_k", "q3_k_s", "q3_k_m", "iq4_nl", "q4_k_s", "q4_k_m", "iq4_xs"):
                new = T.Q5_K
        elif f == "q2_k":
            new = T.Q3_K
        elif f == "q3_k_m":
            new = T.Q4_K
        elif f == "q3_k_l":
            new = T.Q5_K
    return new


def _fallback(chosen: GGMLQuantizationType, row: int) -> GGMLQuantizationType:
    """llama.cpp's ``tensor_type_fallback``: a type whose block divides the row."""
    if row % GGML_QUANT_SIZES[chosen][0] == 0:
        return chosen
    fallback = _FALLBACK.get(chosen, T.F16)
    return fallback if row % GGML_QUANT_SIZES[fallback][0] == 0 else T.F16
