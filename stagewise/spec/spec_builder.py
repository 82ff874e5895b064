"""Build a :class:`ModelSpec` from a :class:`ModelConfig` (counts in docs/accounting.md)."""

from __future__ import annotations

from collections.abc import Mapping

from stagewise.errors import ConfigError
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.decode_splits import decode_partial_values
from stagewise.spec.kernel_counts import ENTRY_KERNELS, EXIT_KERNELS, block_kernels
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.quant_presets import QuantModel, preset
from stagewise.spec.tensor_shapes import TensorShape, block_tensors, entry_tensors, exit_tensors
from stagewise.spec.weight_bytes import rope_table_bytes, split_expert_bytes, total_bytes

DELTA_RULE_CHUNK = 64  # tokens per chunk of the chunked gated delta rule (models/layers/delta_rule.py)


def build_spec(
    c: ModelConfig,
    fmt_name: str,
    name: str,
    tensor_bytes_by_block: Mapping[int, int] | None,
    entry_bytes: int | None,
    exit_bytes: int | None,
) -> ModelSpec:
    fmt = preset(fmt_name)
    model = QuantModel.from_config(c)
    blocks = []
    for i in range(c.num_layers):
        tensors = block_tensors(c, i)
        expert, other = split_expert_bytes(tensors, fmt, model, i)
        weight = expert + other
        read = other + (expert * c.num_experts_per_tok // c.num_experts if expert else 0)  # top-k of E
        if tensor_bytes_by_block is not None:
            if i not in tensor_bytes_by_block:
                raise ConfigError(f"tensor_bytes_by_block: missing block {i}")
            exact = int(tensor_bytes_by_block[i])
            read = read * exact // max(weight, 1)
            weight = exact
        blocks.append(_block(c, i, tensors, weight, read))
    entry_w = total_bytes(entry_tensors(c), fmt, model, None) if entry_bytes is None else int(entry_bytes)
    exit_w = total_bytes(exit_tensors(c), fmt, model, None) if exit_bytes is None else int(exit_bytes)
    head = c.vocab_size * c.hidden_size
    entry = EndSpec(
        weight_bytes=entry_w,
        read_bytes_per_token=entry_w // c.vocab_size,  # one embedding row
        flops_per_token=0,
        kernels_per_token=ENTRY_KERNELS,
    )
    exit_ = EndSpec(
        weight_bytes=exit_w,
        read_bytes_per_token=exit_w,
        flops_per_token=2 * head,  # LM head matmul
        shared_bytes=min(entry_w, exit_w) if c.tie_word_embeddings else 0,
        logits_values_per_token=c.vocab_size,
        kernels_per_token=EXIT_KERNELS,
    )
    return ModelSpec(
        name=name or c.architecture,
        architecture=c.architecture,
        format=fmt.name,
        hidden_size=c.hidden_size,
        vocab_size=c.vocab_size,
        blocks=tuple(blocks),
        entry=entry,
        exit=exit_,
        max_context_tokens=c.max_position_embeddings,
        stage_table_bytes=rope_table_bytes(c),
    )


def _block(c: ModelConfig, i: int, tensors: list[TensorShape], weight: int, read: int) -> BlockSpec:
    h = c.hidden_size
    k = c.num_experts_per_tok
    moe = c.block_is_moe(i)
    matrix = sum(t.elements for t in tensors if t.role in ("matrix", "router"))
    expert = sum(t.elements for t in tensors if t.role == "expert")
    active = matrix + (expert * k // c.num_experts if expert else 0)
    flops = 2 * active  # one multiply-add per active weight
    act = 2 * h  # residual + normed hidden
    mlp_step = _mlp_step_values(c, i)
    if moe:
        s = c.shared_expert_intermediate_size
        act += k * (3 * c.moe_intermediate_size + h) + 3 * s  # dispatched gate/up/act + expert outputs
        f32 = 2 * c.num_experts  # router logits + probabilities
    else:
        act += 3 * c.intermediate_size  # gate, up, activated product
        f32 = 0
    mixer: dict[str, int | str]
    mats: tuple[tuple[int, int], ...]
    if c.block_is_linear(i):
        nv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        conv_dim = c.linear_conv_dim
        act += 2 * conv_dim + 2 * c.linear_value_dim + 2 * nv  # qkv before/after conv, z, output, a, b
        flops += 4 * nv * dk * dv  # recurrent state update + readout
        projected = conv_dim + c.linear_value_dim + 2 * nv  # qkv, z, b, a: the fused input projection
        # at the chunked scan: x and normed, the projection, the conv window and its output
        mixer_step = 2 * h + projected + 2 * conv_dim
        # float32 at the scan (models/layers/delta_rule.py): q, k, k·beta, decayed k·beta, k_cumdecay and a
        # second k while it is rescaled (dk each); v, v·beta, the new values, the output and the state
        # update's operand (dv each); the pair decays, the UT system and the intra-chunk scores (C each)
        f32_step = nv * (6 * dk + 5 * dv + 3 * DELTA_RULE_CHUNK)
        mats = ((projected, h), (conv_dim, h), (c.linear_value_dim, h), (h, c.linear_value_dim))
        mixer = dict(mixer="linear_attention", conv_state_values=conv_dim * c.linear_conv_kernel_dim,
                     recurrent_state_values=nv * dk * dv,
                     cut_values_per_token=h + projected + c.linear_value_dim,  # residual, projection, readout
                     mix_values_per_token=conv_dim)  # the conv's output (the rule reads q, k, v from it)
    else:
        heads, kv, d = c.num_attention_heads, c.num_kv_heads, c.head_dim
        q = heads * d * (2 if c.attn_output_gate else 1)
        act += q + 2 * kv * d + heads * d  # q (+gate), k, v, attention output
        # x and normed, the fused q(+gate)/k/v projection, the rotated q, the attention output, with an
        # output gate its sigmoid and the gated product, and o_proj's output
        mixer_step = 2 * h + q + 2 * kv * d + 2 * heads * d + (2 * heads * d if c.attn_output_gate else 0) + h
        f32_step = 0
        mats = ((q + 2 * kv * d, h), (q, h), (h, heads * d))
        mixer = dict(mixer="attention",
                     kv_values_per_token=2 * kv * d,  # key + value
                     decode_partial_values=decode_partial_values(heads, kv, d),
                     attention_flops_per_position=4 * heads * d,  # q.k and p.v, multiply-add
                     score_values_per_position=heads, kv_heads=kv,
                     cut_values_per_token=h + q + 2 * kv * d + heads * d,  # residual, q(+gate)/k/v, output
                     mix_values_per_token=heads * d)  # the rotated queries (keys and values go to the pool)
    return BlockSpec(
        index=i,
        moe=moe,
        weight_bytes=weight,
        read_bytes_per_token=read,
        flops_per_token=flops,
        activation_values_per_token=act,
        f32_values_per_token=f32,
        kernels_per_token=block_kernels(c, i),
        routed_experts=c.num_experts if moe else 0,
        experts_per_token=k if moe else 0,
        step_values_per_token=max(mixer_step, mlp_step),
        step_f32_values_per_token=f32_step + (k if moe else 0),  # + the routing's int32 slots
        matrices=mats + _mlp_matrices(c, i),
        **mixer,  # type: ignore[arg-type]
    )


def _mlp_step_values(c: ModelConfig, i: int) -> int:
    """Activation-dtype values per token live at the MLP's peak on the Triton path: the block's input,
    the mixer's output, the residual sum and its norm (4h), then the MLP's own (grouped experts:
    the router logits and weights, each routed slot's gate/up, activation and output, their sum;
    dense: gate/up, the activation, the output and the residual sum)."""
    h = c.hidden_size
    if c.block_is_moe(i):
        k, inter = c.num_experts_per_tok, c.moe_intermediate_size
        return 4 * h + c.num_experts + k + k * (3 * inter + h) + 2 * h
    return 4 * h + 3 * c.intermediate_size + 2 * h


def _mlp_matrices(c: ModelConfig, i: int) -> tuple[tuple[int, int], ...]:
    h = c.hidden_size
    if c.block_is_moe(i):
        s, inter = c.shared_expert_intermediate_size, c.moe_intermediate_size
        shared = ((2 * s, h), (h, s)) if s else ()
        return ((2 * inter, h), (h, inter), *shared)  # an expert's matrices (the torch path's loop)
    return ((2 * c.intermediate_size, h), (h, c.intermediate_size))
