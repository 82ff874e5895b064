"""Undo (and, for writing, redo) the layout and value changes llama.cpp's converter makes.

Layouts are index permutations, so they are exact and apply equally to dense values and to the
rows (or whole 32-element blocks) of packed Q8_0 data:

* ``llama_q`` / ``llama_k``: Llama's q/k rows, whose rotary halves the converter interleaves;
* ``qkvz``: Qwen3-Next's fused ``in_proj_qkvz`` (per key-head groups [q, k, v, z]) stored as
  ``attn_qkv`` = [all q, all k, all v] and ``attn_gate`` = [all z];
* ``v_qkv``, ``v_rows``, ``v_heads``, ``v_conv``, ``v_cols``: Qwen3.5's value heads, stored
  "tiled" (v0 of every key group, then v1, ...) instead of grouped by key head;
* ``halves``: stacked experts ``gate_up_proj`` = concat(gate, up) along dim 1.

Values: ``norm_offset`` (stored ``w + 1`` for zero-centred RMSNorm; ``(w + 1) - 1`` is exact in
float32 for weights near 0), ``a_log`` (stored ``-exp(A_log)``), ``conv`` (stored squeezed), ``row``
(the shared-expert gate, which llama.cpp accepts stored 1-D).
"""

from __future__ import annotations

import torch

from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_names import NameRule


def _v_perm(num_k: int, per_k: int, dim: int) -> torch.Tensor:
    """Index ``i`` such that grouped[j] = tiled[i[j]] for value heads of ``dim`` rows each."""
    g = torch.arange(num_k).view(num_k, 1, 1)
    j = torch.arange(per_k).view(1, per_k, 1)
    t = torch.arange(dim).view(1, 1, dim)
    return ((j * num_k + g) * dim + t).reshape(-1)  # ours (g, j, t) <- gguf (j, g, t)


def _llama_perm(heads: int, rows: int) -> torch.Tensor:
    """Index ``i`` such that ours[j] = gguf[i[j]] (converter: reshape(h, 2, d/2).swapaxes(1, 2))."""
    d = rows // heads
    h = torch.arange(heads).view(heads, 1, 1)
    two = torch.arange(2).view(1, 2, 1)
    i = torch.arange(d // 2).view(1, 1, d // 2)
    return (h * d + i * 2 + two).reshape(-1)  # ours (h, two, i) <- gguf (h, i, two)


def row_index(rule: NameRule, config: ModelConfig, rows: int) -> torch.Tensor | None:
    """Permutation of dim 0 (after concatenation): ours = source[index]; None when identity."""
    layout = rule.layout
    if layout == "llama_q":
        return _llama_perm(config.num_attention_heads, rows)
    if layout == "llama_k":
        return _llama_perm(config.num_kv_heads, rows)
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    per_k = nv // nk if nk else 1
    if layout == "qkvz":
        kd, vd = nk * dk, nv * dv
        g = [
            torch.arange(kd).view(nk, dk),  # q
            kd + torch.arange(kd).view(nk, dk),  # k
            2 * kd + torch.arange(vd).view(nk, per_k * dv),  # v
            2 * kd + vd + torch.arange(vd).view(nk, per_k * dv),  # z (second source)
        ]
        return torch.cat(g, dim=1).reshape(-1)
    if per_k == 1 or layout not in ("v_qkv", "v_rows", "v_heads", "v_conv"):
        return None
    if layout == "v_rows":
        return _v_perm(nk, per_k, dv)
    if layout == "v_heads":
        return _v_perm(nk, per_k, 1)
    qk = 2 * nk * dk  # v_qkv, v_conv: q and k channels untouched, then the value channels
    return torch.cat([torch.arange(qk), qk + _v_perm(nk, per_k, dv)])


def col_group_index(rule: NameRule, config: ModelConfig) -> tuple[torch.Tensor, int] | None:
    """Column permutation as (index over groups, group size): ours[:, g] = source[:, index[g]]."""
    if rule.layout != "v_cols":
        return None
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    if nk == 0 or nv == nk:
        return None
    return _v_perm(nk, nv // nk, 1), config.linear_value_head_dim


def expand_groups(index: torch.Tensor, group: int) -> torch.Tensor:
    """Group permutation -> element permutation."""
    return (index.view(-1, 1) * group + torch.arange(group).view(1, -1)).reshape(-1)


def value_from_gguf(rule: NameRule, t: torch.Tensor) -> torch.Tensor:
    """Stored value -> our parameter's value (float32 math for the offsets)."""
    if rule.value == "norm_offset":
        return (t.to(torch.float32) - 1.0).to(t.dtype)
    if rule.value == "a_log":
        return torch.log(-t.to(torch.float32)).to(t.dtype)
    if rule.value == "conv" and t.dim() == 2:
        return t.unsqueeze(1)  # (C, K) -> (C, 1, K)
    if rule.value == "row" and t.dim() == 1:
        return t.unsqueeze(0)  # (H,) -> (1, H)
    return t


def value_to_gguf(rule: NameRule, t: torch.Tensor) -> torch.Tensor:
    """Our parameter's value -> stored value (inverse of :func:`value_from_gguf`)."""
    if rule.value == "norm_offset":
        return (t.to(torch.float32) + 1.0).to(t.dtype)
    if rule.value == "a_log":
        return (-torch.exp(t.to(torch.float32))).to(t.dtype)
    if rule.value == "conv" and t.dim() == 3:
        return t.squeeze(1)
    return t


def split_sizes(rule: NameRule, config: ModelConfig, size: int) -> list[int]:
    """Sizes along ``concat_dim`` of each GGUF source of a multi-tensor rule."""
    if len(rule.gguf) == 1:
        return [size]
    if rule.layout == "halves":
        return [size // 2, size // 2]
    if rule.layout == "qkvz":
        vd = config.linear_value_dim
        return [size - vd, vd]
    raise ValueError(f"no split for rule {rule.ours}")
