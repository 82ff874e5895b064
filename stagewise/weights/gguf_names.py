"""GGUF tensor names <-> our (Hugging Face checkpoint) names, per llama.cpp architecture.

One :class:`NameRule` per parameter: which GGUF tensor(s) make it up (two for stacked experts and
Qwen3-Next's fused ``in_proj_qkvz``), and which layout / value change llama.cpp's converter made
that we undo (see :mod:`stagewise.weights.gguf_layout`). Block tensors are ``blk.<i>.<suffix>``
in GGUF and ``model.layers.<i>.<suffix>`` here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gguf.constants import MODEL_ARCH, MODEL_ARCH_NAMES

from stagewise.errors import UnsupportedArchitecture, WeightsError
from stagewise.spec.model_config import HYBRID_ARCHITECTURES

# llama.cpp architecture name (general.architecture) -> our family
GGUF_ARCHITECTURES: dict[str, str] = {
    MODEL_ARCH_NAMES[MODEL_ARCH.LLAMA]: "llama",
    MODEL_ARCH_NAMES[MODEL_ARCH.QWEN3]: "qwen3",
    MODEL_ARCH_NAMES[MODEL_ARCH.QWEN3MOE]: "qwen3_moe",
    MODEL_ARCH_NAMES[MODEL_ARCH.QWEN3NEXT]: "qwen3_next",
    MODEL_ARCH_NAMES[MODEL_ARCH.QWEN35]: "qwen3_5",
    MODEL_ARCH_NAMES[MODEL_ARCH.QWEN35MOE]: "qwen3_5_moe",
}
FAMILY_TO_GGUF = {family: arch for arch, family in GGUF_ARCHITECTURES.items()}

BLOCK_GGUF = re.compile(r"^blk\.(\d+)\.(.+)$")
BLOCK_OURS = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class NameRule:
    """Our tensor ``ours`` = concat(``gguf`` tensors, ``concat_dim``), re-laid-out and re-valued."""

    ours: str
    gguf: tuple[str, ...]
    concat_dim: int = 0
    layout: str = ""  # see gguf_layout.row_index / col_group_index
    value: str = ""  # "", "norm_offset" (stored w + 1), "a_log" (stored -exp(A_log)), "conv" (squeezed),
    # "row" (a one-row matrix that may be stored 1-D)


def _r(ours: str, *gguf: str, concat_dim: int = 0, layout: str = "", value: str = "") -> NameRule:
    return NameRule(ours, gguf, concat_dim, layout, value)


_TOP = [
    _r("model.embed_tokens.weight", "token_embd.weight"),
    _r("model.norm.weight", "output_norm.weight"),
    _r("lm_head.weight", "output.weight"),
]
_ATTENTION = [
    _r("input_layernorm.weight", "attn_norm.weight"),
    _r("self_attn.q_proj.weight", "attn_q.weight"),
    _r("self_attn.k_proj.weight", "attn_k.weight"),
    _r("self_attn.v_proj.weight", "attn_v.weight"),
    _r("self_attn.o_proj.weight", "attn_output.weight"),
    _r("self_attn.q_proj.bias", "attn_q.bias"),
    _r("self_attn.k_proj.bias", "attn_k.bias"),
    _r("self_attn.v_proj.bias", "attn_v.bias"),
    _r("self_attn.o_proj.bias", "attn_output.bias"),
    _r("self_attn.q_norm.weight", "attn_q_norm.weight"),
    _r("self_attn.k_norm.weight", "attn_k_norm.weight"),
]
_DENSE_MLP = [
    _r("mlp.gate_proj.weight", "ffn_gate.weight"),
    _r("mlp.up_proj.weight", "ffn_up.weight"),
    _r("mlp.down_proj.weight", "ffn_down.weight"),
]
_MOE = [
    _r("mlp.gate.weight", "ffn_gate_inp.weight"),
    _r("mlp.experts.gate_up_proj", "ffn_gate_exps.weight", "ffn_up_exps.weight", concat_dim=1, layout="halves"),
    _r("mlp.experts.down_proj", "ffn_down_exps.weight"),
]
_SHARED_EXPERT = [
    _r("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight", value="row"),  # llama.cpp: (h,) or (1, h)
    _r("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
    _r("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
    _r("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
]
_LINEAR_COMMON = [
    _r("linear_attn.conv1d.weight", "ssm_conv1d.weight", layout="v_conv", value="conv"),
    _r("linear_attn.dt_bias", "ssm_dt.bias", layout="v_heads"),
    _r("linear_attn.A_log", "ssm_a", layout="v_heads", value="a_log"),
    _r("linear_attn.norm.weight", "ssm_norm.weight"),
    _r("linear_attn.out_proj.weight", "ssm_out.weight", layout="v_cols"),
]
_LINEAR_QWEN3NEXT = [
    _r("linear_attn.in_proj_qkvz.weight", "attn_qkv.weight", "attn_gate.weight", layout="qkvz"),
    _r("linear_attn.in_proj_ba.weight", "ssm_ba.weight"),
]
_LINEAR_QWEN35 = [
    _r("linear_attn.in_proj_qkv.weight", "attn_qkv.weight", layout="v_qkv"),
    _r("linear_attn.in_proj_z.weight", "attn_gate.weight", layout="v_rows"),
    _r("linear_attn.in_proj_b.weight", "ssm_beta.weight", layout="v_heads"),
    _r("linear_attn.in_proj_a.weight", "ssm_alpha.weight", layout="v_heads"),
]


def block_rules(family: str) -> list[NameRule]:
    """Rules for one block's tensors (suffixes after ``model.layers.<i>.`` / ``blk.<i>.``)."""
    if family == "llama":
        rules = [*_ATTENTION, _r("post_attention_layernorm.weight", "ffn_norm.weight"), *_DENSE_MLP]
        return [_llama_permuted(r) for r in rules]
    if family == "qwen3":
        return [*_ATTENTION, _r("post_attention_layernorm.weight", "ffn_norm.weight"), *_DENSE_MLP]
    if family == "qwen3_moe":
        return [*_ATTENTION, _r("post_attention_layernorm.weight", "ffn_norm.weight"), *_DENSE_MLP, *_MOE]
    hybrid = [*_ATTENTION, _r("post_attention_layernorm.weight", "post_attention_norm.weight"), *_LINEAR_COMMON]
    if family == "qwen3_next":
        rules = [*hybrid, *_LINEAR_QWEN3NEXT, *_DENSE_MLP, *_MOE, *_SHARED_EXPERT]
    elif family == "qwen3_5":
        rules = [*hybrid, *_LINEAR_QWEN35, *_DENSE_MLP]
    elif family == "qwen3_5_moe":
        rules = [*hybrid, *_LINEAR_QWEN35, *_DENSE_MLP, *_MOE, *_SHARED_EXPERT]
    else:
        raise UnsupportedArchitecture(f"no GGUF name map for architecture {family!r}")
    return [_zero_centred(r) for r in rules]


def top_rules(family: str) -> list[NameRule]:
    if family in HYBRID_ARCHITECTURES:
        return [_zero_centred(r) for r in _TOP]
    return list(_TOP)


def _llama_permuted(rule: NameRule) -> NameRule:
    # llama.cpp's converter interleaves the rotary halves of each q/k head (weights and biases)
    if rule.ours.startswith("self_attn.q_proj."):
        return NameRule(rule.ours, rule.gguf, layout="llama_q")
    if rule.ours.startswith("self_attn.k_proj."):
        return NameRule(rule.ours, rule.gguf, layout="llama_k")
    return rule


def _zero_centred(rule: NameRule) -> NameRule:
    # the hybrid families' RMSNorms compute x * (1 + w); the converter stores w + 1, except for the
    # gated norm inside linear attention, which is a plain RMSNorm
    if rule.ours.endswith("norm.weight") and not rule.ours.startswith("linear_attn."):
        return NameRule(rule.ours, rule.gguf, rule.concat_dim, rule.layout, "norm_offset")
    return rule


@dataclass(frozen=True)
class BoundRule:
    """A rule bound to concrete names (block index filled in)."""

    ours: str
    gguf: tuple[str, ...]
    rule: NameRule
    block: int | None


def blocks_present(gguf_names: set[str]) -> int:
    """One more than the highest block index among ``blk.<i>.*`` names (0 when there are none)."""
    indices = [int(m.group(1)) for m in map(BLOCK_GGUF.match, gguf_names) if m is not None]
    return max(indices, default=-1) + 1


KNOWN_IGNORED_TOP = frozenset({"rope_freqs.weight"})  # folded into the config (Llama 3 rope factors)
_NAMED_AT_MOST = 5


def bind_gguf_names(family: str, gguf_names: set[str], num_layers: int,
                    label: str = "") -> tuple[list[BoundRule], set[str]]:
    """Group the file's tensor names into our tensors; returns (rules, names we knowingly ignore).

    Blocks at index >= ``num_layers`` (the MTP / next-n block counted in ``block_count``) and
    :data:`KNOWN_IGNORED_TOP` (``rope_freqs.weight``, folded into the config) are ignored. Any other
    name no rule knows (``rope_freqs.weighu``: one flipped bit) is a :class:`WeightsError` naming
    them, never silently skipped: the model would run without that tensor. ``label`` names the file.
    """
    by_gguf: dict[str, list[tuple[NameRule, int | None]]] = {}
    for rule in top_rules(family):
        by_gguf.setdefault(rule.gguf[0], []).append((rule, None))
    block_table = block_rules(family)
    ignored: set[str] = set()
    unknown: list[str] = []
    bound: list[BoundRule] = []
    for name in sorted(gguf_names):
        if name in KNOWN_IGNORED_TOP:
            ignored.add(name)
            continue
        match = BLOCK_GGUF.match(name)
        if match is None:
            for rule, _ in by_gguf.get(name, []):
                bound.append(BoundRule(rule.ours, rule.gguf, rule, None))
            if name not in by_gguf:
                unknown.append(name)
            continue
        index, suffix = int(match.group(1)), match.group(2)
        if index >= num_layers:
            ignored.add(name)
            continue
        rules = [r for r in block_table if r.gguf[0] == suffix]
        if not rules:
            if not any(suffix in r.gguf[1:] for r in block_table):  # else: second part of a multi-tensor rule
                unknown.append(name)
            continue
        for rule in rules:
            gguf = tuple(f"blk.{index}.{g}" for g in rule.gguf)
            bound.append(BoundRule(f"model.layers.{index}.{rule.ours}", gguf, rule, index))
    if unknown:
        shown = ", ".join(repr(n[:80]) for n in unknown[:_NAMED_AT_MOST])
        more = f" and {len(unknown) - _NAMED_AT_MOST} more" if len(unknown) > _NAMED_AT_MOST else ""
        where = f"{label}: " if label else ""
        raise WeightsError(f"{where}unknown GGUF tensor{'s' if len(unknown) > 1 else ''} {shown}{more} "
                           f"for architecture {family!r} (not part of this model: a corrupt or unsupported file)")
    return bound, ignored


def rule_for_ours(family: str, name: str) -> tuple[NameRule, int | None]:
    """The rule that produces our tensor ``name`` (used when writing GGUF files)."""
    match = BLOCK_OURS.match(name)
    if match is None:
        for rule in top_rules(family):
            if rule.ours == name:
                return rule, None
        raise UnsupportedArchitecture(f"tensor {name!r} has no GGUF name for architecture {family!r}")
    index, suffix = int(match.group(1)), match.group(2)
    for rule in block_rules(family):
        if rule.ours == suffix:
            return rule, index
    raise UnsupportedArchitecture(f"tensor {name!r} has no GGUF name for architecture {family!r}")
