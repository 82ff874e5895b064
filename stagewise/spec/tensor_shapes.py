"""Parameter shapes per block, entry and exit, by architecture (HF names, (out, in) order).

Roles decide the stored format (see :mod:`stagewise.spec.weight_bytes`): ``matrix``,
``expert`` (routed experts: read top-k of num_experts per token), ``embedding``, ``head``,
and small ``vector`` / ``router`` / ``conv`` tensors that llama.cpp keeps in f32.
``gguf`` names the GGUF tensor(s) holding the parameter (block-relative, as
:mod:`stagewise.weights.gguf_names` maps them) with their shapes, so a preset's per-tensor types
(:mod:`stagewise.spec.quant_presets`) apply without the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.spec.model_config import ModelConfig


@dataclass(frozen=True)
class TensorShape:
    name: str
    shape: tuple[int, ...]
    role: str  # matrix | expert | embedding | head | vector | router | conv
    gguf: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (GGUF name, GGUF shape) of each stored part

    @property
    def parts(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """The stored parts; a tensor without a GGUF name is one part of its own shape."""
        return self.gguf or ((self.name, self.shape),)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _t(name: str, shape: tuple[int, ...], role: str, gguf: str) -> TensorShape:
    """One parameter stored as one GGUF tensor of the same shape."""
    return TensorShape(name, shape, role, ((gguf, shape),))


def block_tensors(c: ModelConfig, i: int) -> list[TensorShape]:
    """Every parameter of block ``i``."""
    h = c.hidden_size
    post = "post_attention_norm.weight" if c.is_hybrid else "ffn_norm.weight"
    out = [_t("input_layernorm", (h,), "vector", "attn_norm.weight"), _t("post_attention_layernorm", (h,), "vector", post)]
    out += _linear_attention(c) if c.block_is_linear(i) else _attention(c)
    out += _moe(c) if c.block_is_moe(i) else _dense_mlp(c)
    return out


def entry_tensors(c: ModelConfig) -> list[TensorShape]:
    return [_t("embed_tokens", (c.vocab_size, c.hidden_size), "embedding", "token_embd.weight")]


def exit_tensors(c: ModelConfig) -> list[TensorShape]:
    """Final norm and LM head; with tied embeddings the head is a copy of the embedding."""
    role = "embedding" if c.tie_word_embeddings else "head"
    head = (c.vocab_size, c.hidden_size)
    stored = "token_embd.weight" if c.tie_word_embeddings else "output.weight"
    return [_t("norm", (c.hidden_size,), "vector", "output_norm.weight"), _t("lm_head", head, role, stored)]


def _attention(c: ModelConfig) -> list[TensorShape]:
    h, d = c.hidden_size, c.head_dim
    q_rows = c.num_attention_heads * d * (2 if c.attn_output_gate else 1)  # query (+ output gate)
    kv_rows = c.num_kv_heads * d
    out = [
        _t("q_proj", (q_rows, h), "matrix", "attn_q.weight"),
        _t("k_proj", (kv_rows, h), "matrix", "attn_k.weight"),
        _t("v_proj", (kv_rows, h), "matrix", "attn_v.weight"),
        _t("o_proj", (h, c.num_attention_heads * d), "matrix", "attn_output.weight"),
    ]
    if c.attention_bias:
        out += [
            _t("q_proj.bias", (q_rows,), "vector", "attn_q.bias"),
            _t("k_proj.bias", (kv_rows,), "vector", "attn_k.bias"),
            _t("v_proj.bias", (kv_rows,), "vector", "attn_v.bias"),
        ]
    if c.architecture != "llama":  # qwen3 family: per-head RMSNorm on q and k
        out += [_t("q_norm", (d,), "vector", "attn_q_norm.weight"), _t("k_norm", (d,), "vector", "attn_k_norm.weight")]
    return out


def _linear_attention(c: ModelConfig) -> list[TensorShape]:
    h, nv = c.hidden_size, c.linear_num_value_heads
    conv_dim, value_dim = c.linear_conv_dim, c.linear_value_dim
    if c.architecture == "qwen3_next":
        proj = [
            TensorShape("in_proj_qkvz", (2 * c.linear_key_dim + 2 * value_dim, h), "matrix",
                        (("attn_qkv.weight", (2 * c.linear_key_dim + value_dim, h)), ("attn_gate.weight", (value_dim, h)))),
            _t("in_proj_ba", (2 * nv, h), "matrix", "ssm_ba.weight"),
        ]
    else:  # qwen3_5 family
        proj = [
            _t("in_proj_qkv", (conv_dim, h), "matrix", "attn_qkv.weight"),
            _t("in_proj_z", (value_dim, h), "matrix", "attn_gate.weight"),
            _t("in_proj_b", (nv, h), "matrix", "ssm_beta.weight"),
            _t("in_proj_a", (nv, h), "matrix", "ssm_alpha.weight"),
        ]
    return [
        *proj,
        TensorShape("conv1d", (conv_dim, 1, c.linear_conv_kernel_dim), "conv",
                    (("ssm_conv1d.weight", (conv_dim, c.linear_conv_kernel_dim)),)),  # stored squeezed
        _t("dt_bias", (nv,), "vector", "ssm_dt.bias"),
        _t("A_log", (nv,), "vector", "ssm_a"),
        _t("norm", (c.linear_value_head_dim,), "vector", "ssm_norm.weight"),
        _t("out_proj", (h, value_dim), "matrix", "ssm_out.weight"),
    ]


def _dense_mlp(c: ModelConfig) -> list[TensorShape]:
    h, inter = c.hidden_size, c.intermediate_size
    return [
        _t("gate_proj", (inter, h), "matrix", "ffn_gate.weight"),
        _t("up_proj", (inter, h), "matrix", "ffn_up.weight"),
        _t("down_proj", (h, inter), "matrix", "ffn_down.weight"),
    ]


def _moe(c: ModelConfig) -> list[TensorShape]:
    h, e, inter = c.hidden_size, c.num_experts, c.moe_intermediate_size
    out = [
        _t("gate", (e, h), "router", "ffn_gate_inp.weight"),
        _t("experts.gate_proj", (e, inter, h), "expert", "ffn_gate_exps.weight"),
        _t("experts.up_proj", (e, inter, h), "expert", "ffn_up_exps.weight"),
        _t("experts.down_proj", (e, h, inter), "expert", "ffn_down_exps.weight"),
    ]
    s = c.shared_expert_intermediate_size
    if s:
        out += [
            _t("shared_expert.gate_proj", (s, h), "matrix", "ffn_gate_shexp.weight"),
            _t("shared_expert.up_proj", (s, h), "matrix", "ffn_up_shexp.weight"),
            _t("shared_expert.down_proj", (h, s), "matrix", "ffn_down_shexp.weight"),
            TensorShape("shared_expert_gate", (1, h), "router", (("ffn_gate_inp_shexp.weight", (h,)),)),  # stored 1-D
        ]
    return out
