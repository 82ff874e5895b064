"""Write a model's parameters as a GGUF file the way llama.cpp's converter lays them out.

Metadata and the tensor table go first (``gguf.GGUFWriter``), then each tensor's data is streamed
chunk by chunk, so memory stays bounded by one chunk (one matrix where a row permutation needs
it). The converter's changes are applied (:mod:`stagewise.weights.gguf_layout`), so files read
back through :class:`~stagewise.weights.gguf_source.GGUFSource` like real converted ones.
Type policy (as llama.cpp's ``--outtype``): 1-D tensors, routers and the small linear-attention
projections stay F32; other matrices take the requested type where their rows divide into its
blocks, else llama.cpp's fallback (Q4_K -> Q5_0, Q6_K -> Q8_0, …), else F16; a quantized type that
is a preset of :mod:`stagewise.spec.quant_presets` (``q4_0``, ``q4_k_m`` …) gives each tensor
llama.cpp's type for it (the head Q6_K or Q8_0, ``attn_v`` upgrades …).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, Keys, LlamaFileType

from stagewise.errors import ConfigError
from stagewise.spec.model_config import ModelConfig, layer_types_for_interval
from stagewise.spec.quant_presets import KEEP_F32, PRESETS, QuantModel, tensor_type
from stagewise.weights.gguf_config import llama3_rope_factors
from stagewise.weights.gguf_layout import col_group_index, expand_groups, row_index, split_sizes, value_to_gguf
from stagewise.weights.gguf_names import FAMILY_TO_GGUF, NameRule, rule_for_ours
from stagewise.weights.quant.quantize import QUANTIZERS, quantize
from stagewise.weights.quant.quantize import quantize_q8_0 as quantize_q8_0  # re-exported (older imports)

Chunks = Callable[[str, tuple[int, ...]], Iterator[torch.Tensor]]  # (our name, shape) -> float32 chunks on dim 0

FILE_TYPES = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (GGMLQuantizationType.Q4_1, LlamaFileType.MOSTLY_Q4_1),
    "q5_0": (GGMLQuantizationType.Q5_0, LlamaFileType.MOSTLY_Q5_0),
    "q5_1": (GGMLQuantizationType.Q5_1, LlamaFileType.MOSTLY_Q5_1),
    # every matrix of one K type: llama.cpp has no "all Q3_K/Q4_K/Q5_K" file type, its _S presets
    # (mostly that type) are the nearest; general.file_type is informational, loading reads each tensor
    "q2_k": (GGMLQuantizationType.Q2_K, LlamaFileType.MOSTLY_Q2_K),
    "q3_k": (GGMLQuantizationType.Q3_K, LlamaFileType.MOSTLY_Q3_K_S),
    "q4_k": (GGMLQuantizationType.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
    "q5_k": (GGMLQuantizationType.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
    "q6_k": (GGMLQuantizationType.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    "iq4_nl": (GGMLQuantizationType.IQ4_NL, LlamaFileType.MOSTLY_IQ4_NL),
    "iq4_xs": (GGMLQuantizationType.IQ4_XS, LlamaFileType.MOSTLY_IQ4_XS),
    "mxfp4": (GGMLQuantizationType.MXFP4, LlamaFileType.MOSTLY_MXFP4_MOE),
    # llama.cpp's mixes: each tensor's type from spec/quant_presets (the default type given here)
    "q3_k_s": (GGMLQuantizationType.Q3_K, LlamaFileType.MOSTLY_Q3_K_S),
    "q3_k_m": (GGMLQuantizationType.Q3_K, LlamaFileType.MOSTLY_Q3_K_M),
    "q3_k_l": (GGMLQuantizationType.Q3_K, LlamaFileType.MOSTLY_Q3_K_L),
    "q4_k_s": (GGMLQuantizationType.Q4_K, LlamaFileType.MOSTLY_Q4_K_S),
    "q4_k_m": (GGMLQuantizationType.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q5_k_s": (GGMLQuantizationType.Q5_K, LlamaFileType.MOSTLY_Q5_K_S),
    "q5_k_m": (GGMLQuantizationType.Q5_K, LlamaFileType.MOSTLY_Q5_K_M),
    "mxfp4_moe": (GGMLQuantizationType.MXFP4, LlamaFileType.MOSTLY_MXFP4_MOE),
}


# llama.cpp requires rope.dimension_sections for these (interleaved multimodal rope); on text every
# section sees the same position, so any split of the rotary pairs is the plain rope we run
_MROPE_ARCHITECTURES = ("qwen35", "qwen35moe")


def mrope_sections(rotary_dim: int) -> list[int]:
    """Qwen3.5's split of the ``rotary_dim // 2`` rotary pairs into (t, h, w, 0) sections, largest
    first: 32 pairs -> [11, 11, 10, 0], as the converter writes Qwen3.5's ``mrope_section``."""
    pairs = rotary_dim // 2
    return [pairs // 3 + (1 if i < pairs % 3 else 0) for i in range(3)] + [0]


@dataclass(frozen=True)
class _Planned:
    gguf_name: str
    shape: tuple[int, ...]  # torch order
    ggml_type: GGMLQuantizationType
    ours: str
    our_shape: tuple[int, ...]
    rule: NameRule | None  # None: rope_freqs (not a parameter)
    part: int

    @property
    def nbytes(self) -> int:
        block, type_bytes = GGML_QUANT_SIZES[self.ggml_type]
        n = 1
        for d in self.shape:
            n *= d
        return n // block * type_bytes


def write_gguf(path: Path, config: ModelConfig, params: list[tuple[str, tuple[int, ...]]], chunks: Chunks,
               dtype: str, metadata: dict[str, Any], split_max_bytes: int = 0, name: str = "stagewise-random") -> list[Path]:
    """Write ``params`` (our names, in order) to ``path``; returns the files written (several when split).

    Args:
        chunks: yields each parameter's float32 values in chunks along dim 0.
        dtype: a key of :data:`FILE_TYPES` (``f32``, ``f16``, ``bf16``, or a packed type: ``q8_0``,
            ``q4_k``, ``iq4_xs``, ``mxfp4`` …, every matrix in that type where its rows allow).
        metadata: extra GGUF fields (the ``tokenizer.*`` ones).
        split_max_bytes: split into ``-0000N-of-0000M.gguf`` parts of at most this many tensor bytes.
    """
    if dtype not in FILE_TYPES:
        raise ConfigError(f"GGUF dtype {dtype!r} is not supported ({', '.join(FILE_TYPES)})")
    _check_representable(config)
    arch = FAMILY_TO_GGUF[config.architecture]
    plan = _plan(config, params, FILE_TYPES[dtype][0], dtype)
    writer = gguf.GGUFWriter(path, arch, split_max_size=split_max_bytes)
    writer.add_name(name)
    writer.add_file_type(int(FILE_TYPES[dtype][1]))
    _add_hparams(writer, arch, config)
    for key, value in metadata.items():
        _add_field(writer, key, value)
    for t in plan:
        writer.add_tensor_info(t.gguf_name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None
    by_name = {t.gguf_name: t for t in plan}
    files = writer.format_shard_names(path)
    for fout, shard in zip(writer.fout, writer.tensors, strict=True):
        writer.write_padding(fout, fout.tell())
        for gguf_name in shard:
            t = by_name[gguf_name]
            written = 0
            for piece in _gguf_chunks(config, t, chunks):
                data = _encode(piece, t.ggml_type)
                data.tofile(fout)
                written += data.nbytes
            assert written == t.nbytes, (gguf_name, written, t.nbytes)
            writer.write_padding(fout, t.nbytes)
    writer.close()
    return files


def _check_representable(config: ModelConfig) -> None:
    if config.attention_bias or config.mlp_bias:
        raise ConfigError("GGUF export of attention/MLP biases is not supported")
    if config.mlp_only_layers or config.decoder_sparse_step > 1 or (config.is_moe and not config.norm_topk_prob):
        raise ConfigError("GGUF cannot express mlp_only_layers, decoder_sparse_step or norm_topk_prob=false")
    if config.is_hybrid:
        interval = _attention_interval(config)
        if interval is None:
            raise ConfigError("GGUF needs hybrid layer types with one full-attention block every N blocks")
    if config.rope.rope_type == "llama3" and (config.rope.low_freq_factor, config.rope.high_freq_factor) != (1.0, 4.0):
        raise ConfigError("GGUF export of llama3 rope needs low_freq_factor 1 and high_freq_factor 4")


def _attention_interval(config: ModelConfig) -> int | None:
    for interval in range(1, config.num_layers + 1):
        if layer_types_for_interval(interval, config.num_layers) == config.layer_types:
            return interval
    return None


def _add_hparams(w: gguf.GGUFWriter, arch: str, c: ModelConfig) -> None:
    k = Keys
    w.add_uint32(k.LLM.VOCAB_SIZE.format(arch=arch), c.vocab_size)
    w.add_uint32(k.LLM.CONTEXT_LENGTH.format(arch=arch), c.max_position_embeddings)
    w.add_uint32(k.LLM.EMBEDDING_LENGTH.format(arch=arch), c.hidden_size)
    w.add_uint32(k.LLM.BLOCK_COUNT.format(arch=arch), c.num_layers)
    if c.intermediate_size:
        w.add_uint32(k.LLM.FEED_FORWARD_LENGTH.format(arch=arch), c.intermediate_size)
    w.add_uint32(k.Attention.HEAD_COUNT.format(arch=arch), c.num_attention_heads)
    w.add_uint32(k.Attention.HEAD_COUNT_KV.format(arch=arch), c.num_kv_heads)
    w.add_uint32(k.Attention.KEY_LENGTH.format(arch=arch), c.head_dim)
    w.add_uint32(k.Attention.VALUE_LENGTH.format(arch=arch), c.head_dim)
    w.add_float32(k.Attention.LAYERNORM_RMS_EPS.format(arch=arch), c.rms_norm_eps)
    w.add_float32(k.Rope.FREQ_BASE.format(arch=arch), c.rope.theta)
    w.add_uint32(k.Rope.DIMENSION_COUNT.format(arch=arch), c.rotary_dim)
    if c.rope.rope_type == "llama3":
        w.add_uint32(k.Rope.SCALING_ORIG_CTX_LEN.format(arch=arch), c.rope.original_max_position_embeddings)
    if arch in _MROPE_ARCHITECTURES:
        w.add_array(k.Rope.DIMENSION_SECTIONS.format(arch=arch), mrope_sections(c.rotary_dim))
    if c.is_moe:
        w.add_uint32(k.LLM.EXPERT_COUNT.format(arch=arch), c.num_experts)
        w.add_uint32(k.LLM.EXPERT_USED_COUNT.format(arch=arch), c.num_experts_per_tok)
        w.add_uint32(k.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch), c.moe_intermediate_size)
        if c.shared_expert_intermediate_size:
            w.add_uint32(k.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH.format(arch=arch), c.shared_expert_intermediate_size)
    if c.is_hybrid:
        w.add_uint32(k.SSM.CONV_KERNEL.format(arch=arch), c.linear_conv_kernel_dim)
        w.add_uint32(k.SSM.STATE_SIZE.format(arch=arch), c.linear_key_head_dim)
        w.add_uint32(k.SSM.GROUP_COUNT.format(arch=arch), c.linear_num_key_heads)
        w.add_uint32(k.SSM.TIME_STEP_RANK.format(arch=arch), c.linear_num_value_heads)
        w.add_uint32(k.SSM.INNER_SIZE.format(arch=arch), c.linear_value_dim)
        w.add_uint32(k.LLM.FULL_ATTENTION_INTERVAL.format(arch=arch), _attention_interval(c) or 4)


def _add_field(w: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        w.add_array(key, list(value))
    else:
        raise ConfigError(f"GGUF field {key} has an unsupported value type {type(value).__name__}")


def stored_types(config: ModelConfig, params: list[tuple[str, tuple[int, ...]]],
                 dtype: str) -> dict[str, tuple[GGMLQuantizationType, ...]]:
    """Each parameter's (our name) stored types, one per GGUF part in part order, in the ``dtype`` file
    :func:`write_gguf` would write: llama.cpp's per-tensor types for a mix (``q4_k_m``), the row fallbacks."""
    if dtype not in FILE_TYPES:
        raise ConfigError(f"GGUF dtype {dtype!r} is not supported ({', '.join(FILE_TYPES)})")
    types: dict[str, list[GGMLQuantizationType]] = {}
    for t in _plan(config, params, FILE_TYPES[dtype][0], dtype):
        if t.rule is not None:
            types.setdefault(t.ours, []).append(t.ggml_type)
    return {name: tuple(parts) for name, parts in types.items()}


def _plan(config: ModelConfig, params: list[tuple[str, tuple[int, ...]]], matrix_type: GGMLQuantizationType,
          dtype: str = "") -> list[_Planned]:
    plan: list[_Planned] = []
    model = QuantModel.from_config(config)
    if config.rope.rope_type in ("llama3", "factors"):
        plan.append(_Planned("rope_freqs.weight", (len(_rope_factors(config)),), GGMLQuantizationType.F32, "", (), None, 0))
    for ours, shape in params:
        rule, block = rule_for_ours(config.architecture, ours)
        sizes = split_sizes(rule, config, shape[rule.concat_dim])
        for part, (suffix, size) in enumerate(zip(rule.gguf, sizes, strict=True)):
            gshape = list(shape)
            gshape[rule.concat_dim] = size
            if rule.value == "conv":
                gshape.pop(1)  # (C, 1, K) -> (C, K)
            gguf_name = suffix if block is None else f"blk.{block}.{suffix}"
            stored = _storage_type(suffix, tuple(gshape), matrix_type, dtype, gguf_name, model)
            plan.append(_Planned(gguf_name, tuple(gshape), stored, ours, shape, rule, part))
    return plan


# llama.cpp's type for a 256-block type's matrix whose rows do not divide into 256
# (tensor_type_fallback in the vendored llama.cpp's src/llama-quant.cpp)
_ROW_FALLBACK = {
    GGMLQuantizationType.Q2_K: GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q3_K: GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_K: GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_K: GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q6_K: GGMLQuantizationType.Q8_0, GGMLQuantizationType.IQ4_XS: GGMLQuantizationType.IQ4_NL,
}


def _storage_type(suffix: str, shape: tuple[int, ...], matrix_type: GGMLQuantizationType, dtype: str = "",
                  gguf_name: str = "", model: QuantModel | None = None) -> GGMLQuantizationType:
    if len(shape) < 2 or suffix in KEEP_F32:
        return GGMLQuantizationType.F32
    if dtype in PRESETS and PRESETS[dtype].quantized and model is not None:
        return tensor_type(dtype, gguf_name, shape, model)  # llama.cpp's per-tensor type for the preset
    if shape[-1] % GGML_QUANT_SIZES[matrix_type][0]:  # rows that do not divide into the type's blocks
        matrix_type = _ROW_FALLBACK.get(matrix_type, matrix_type)
    if shape[-1] % GGML_QUANT_SIZES[matrix_type][0]:  # nor into the (fallback) type's blocks
        return GGMLQuantizationType.F16 if shape[-1] % 2 == 0 else GGMLQuantizationType.F32
    return matrix_type


def _rope_factors(config: ModelConfig) -> list[float]:
    """``rope_freqs.weight``: the file's own factors as given, or llama3 scaling's."""
    if config.rope.rope_type == "factors":
        return list(config.rope.freq_factors)
    return llama3_rope_factors(config.rope, config.head_dim)


def _gguf_chunks(config: ModelConfig, t: _Planned, chunks: Chunks) -> Iterator[torch.Tensor]:
    if t.rule is None:  # rope_freqs
        yield torch.tensor(_rope_factors(config), dtype=torch.float32)
        return
    rule = t.rule
    rows = row_index(rule, config, t.our_shape[0])
    source: Iterator[torch.Tensor] = chunks(t.ours, t.our_shape)
    if rows is not None:  # a row permutation needs the whole matrix
        whole = torch.cat(list(source), dim=0)
        inverse = torch.empty_like(rows)
        inverse[rows] = torch.arange(rows.numel())
        source = iter([whole])
    for piece in source:
        piece = value_to_gguf(rule, piece)
        cols = col_group_index(rule, config)
        if cols is not None:
            index = expand_groups(*cols)
            inv = torch.empty_like(index)
            inv[index] = torch.arange(index.numel())
            piece = piece.index_select(1, inv.to(piece.device))
        if rows is not None:
            piece = piece.index_select(0, inverse.to(piece.device))
        if len(rule.gguf) > 1:
            # chunks run along dim 0, so a dim-0 concatenation must have come whole (row permutation)
            assert rule.concat_dim > 0 or piece.shape[0] == t.our_shape[0]
            sizes = split_sizes(rule, config, piece.shape[rule.concat_dim])
            piece = torch.split(piece, sizes, dim=rule.concat_dim)[t.part]
        yield piece


def _encode(piece: torch.Tensor, ggml_type: GGMLQuantizationType) -> np.ndarray:
    """The file bytes of ``piece`` (rows along dim 0, the GGUF row last) in ``ggml_type``; block
    types are quantized where the piece lives (:func:`~stagewise.weights.quant.quantize.quantize`)."""
    piece = piece.contiguous()
    if ggml_type in QUANTIZERS:
        return quantize(piece.reshape(-1, piece.shape[-1]), ggml_type).cpu().numpy()
    piece = piece.cpu()
    if ggml_type == GGMLQuantizationType.F32:
        return piece.to(torch.float32).numpy()
    if ggml_type == GGMLQuantizationType.F16:
        return piece.to(torch.float16).numpy()
    if ggml_type == GGMLQuantizationType.BF16:
        return piece.to(torch.bfloat16).view(torch.int16).numpy()
    raise ConfigError(f"cannot write GGUF type {ggml_type.name}")
