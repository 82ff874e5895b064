"""Parameter shapes per block, entry and exit, by architecture (HF names, (out, in) order).

Roles decide the stored format (see :mod:`stagewise.spec.weight_bytes`): ``matrix``,
``expert`` (routed experts: read top-k of num_experts per token), ``embedding``, ``head``,
and small ``vector`` / ``router`` / ``conv`` tensors that llama.cpp keeps in f32.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.spec.model_config import ModelConfig


@dataclass(frozen=True)
class TensorShape:
    name: str
    shape: tuple[int, ...]
    role: str  # matrix | expert | embedding | head | vector | router | conv

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def block_tensors(c: ModelConfig, i: int) -> list[TensorShape]:
    """Every parameter of block ``i``."""
    h = c.hidden_size
    out = [TensorShape("input_layernorm", (h,), "vector"), TensorShape("post_attention_layernorm", (h,), "vector")]
    out += _linear_attention(c) if c.block_is_linear(i) else _attention(c)
    out += _moe(c) if c.block_is_moe(i) else _dense_mlp(c)
    return out


def entry_tensors(c: ModelConfig) -> list[TensorShape]:
    return [TensorShape("embed_tokens", (c.vocab_size, c.hidden_size), "embedding")]


def exit_tensors(c: ModelConfig) -> list[TensorShape]:
    """Final norm and LM head; with tied embeddings the head is a copy of the embedding."""
    role = "embedding" if c.tie_word_embeddings else "head"
    return [TensorShape("norm", (c.hidden_size,), "vector"), TensorShape("lm_head", (c.vocab_size, c.hidden_size), role)]


def _attention(c: ModelConfig) -> list[TensorShape]:
    h, d = c.hidden_size, c.head_dim
    q_rows = c.num_attention_heads * d * (2 if c.attn_output_gate else 1)  # query (+ output gate)
    kv_rows = c.num_kv_heads * d
    out = [
        TensorShape("q_proj", (q_rows, h), "matrix"),
        TensorShape("k_proj", (kv_rows, h), "matrix"),
        TensorShape("v_proj", (kv_rows, h), "matrix"),
        TensorShape("o_proj", (h, c.num_attention_heads * d), "matrix"),
    ]
    if c.attention_bias:
        out += [
            TensorShape("q_proj.bias", (q_rows,), "vector"),
            TensorShape("k_proj.bias", (kv_rows,), "vector"),
            TensorShape("v_proj.bias", (kv_rows,), "vector"),
        ]
    if c.architecture != "llama":  # qwen3 family: per-head RMSNorm on q and k
        out += [TensorShape("q_norm", (d,), "vector"), TensorShape("k_norm", (d,), "vector")]
    return out


def _linear_attention(c: ModelConfig) -> list[TensorShape]:
    h, nv = c.hidden_size, c.linear_num_value_heads
    conv_dim, value_dim = c.linear_conv_dim, c.linear_value_dim
    if c.architecture == "qwen3_next":
        proj = [
            TensorShape("in_proj_qkvz", (2 * c.linear_key_dim + 2 * value_dim, h), "matrix"),
            TensorShape("in_proj_ba", (2 * nv, h), "matrix"),
        ]
    else:  # qwen3_5 family
        proj = [
            TensorShape("in_proj_qkv", (conv_dim, h), "matrix"),
            TensorShape("in_proj_z", (value_dim, h), "matrix"),
            TensorShape("in_proj_b", (nv, h), "matrix"),
            TensorShape("in_proj_a", (nv, h), "matrix"),
        ]
    return [
        *proj,
        TensorShape("conv1d", (conv_dim, 1, c.linear_conv_kernel_dim), "conv"),
        TensorShape("dt_bias", (nv,), "vector"),
        TensorShape("A_log", (nv,), "vector"),
        TensorShape("norm", (c.linear_value_head_dim,), "vector"),
        TensorShape("out_proj", (h, value_dim), "matrix"),
    ]


def _dense_mlp(c: ModelConfig) -> list[TensorShape]:
    h, inter = c.hidden_size, c.intermediate_size
    return [
        TensorShape("gate_proj", (inter, h), "matrix"),
        TensorShape("up_proj", (inter, h), "matrix"),
        TensorShape("down_proj", (h, inter), "matrix"),
    ]


def _moe(c: ModelConfig) -> list[TensorShape]:
    h, e, inter = c.hidden_size, c.num_experts, c.moe_intermediate_size
    out = [
        TensorShape("gate", (e, h), "router"),
        TensorShape("experts.gate_proj", (e, inter, h), "expert"),
        TensorShape("experts.up_proj", (e, inter, h), "expert"),
        TensorShape("experts.down_proj", (e, h, inter), "expert"),
    ]
    s = c.shared_expert_intermediate_size
    if s:
        out += [
            TensorShape("shared_expert.gate_proj", (s, h), "matrix"),
            TensorShape("shared_expert.up_proj", (s, h), "matrix"),
            TensorShape("shared_expert.down_proj", (h, s), "matrix"),
            TensorShape("shared_expert_gate", (1, h), "router"),
        ]
    return out
