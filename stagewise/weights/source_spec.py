"""ModelSpecs whose weight bytes are what the loader will make resident, computed without torch.

One rule (the loader's, :func:`stagewise.weights.tensor_source.keeps_packed`): a tensor stays
resident as the file's blocks when its source stores it in a packed type of
:mod:`~stagewise.spec.packed_types` and the module owning it takes packed weights (a
projection, expert stack, embedding, head or router: :func:`holds_packed`, by name); anything else
is dense at the run dtype, expanded IQ types included. So GGUF files (each tensor its own type),
random packed weights and a config with ``--format q4_k_m`` are charged by the rule that loads
them, and ``plan`` / ``assess`` never build the model.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import replace
from typing import Protocol

from gguf.constants import GGMLQuantizationType

from stagewise.errors import ConfigError
from stagewise.spec.formats import activation_bytes
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.packed_types import block_elements, format_name, is_expanded, is_packed, row_bytes
from stagewise.spec.quant_presets import KEEP_F32, QuantModel, preset
from stagewise.spec.tensor_shapes import TensorShape, block_tensors, entry_tensors, exit_tensors
from stagewise.spec.weight_bytes import (
    Expansion,
    keeps_packed,
    part_types,
    rope_table_bytes,
    shape_bytes,
    stored_bytes,
)

EMBEDDING = "model.embed_tokens.weight"
_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERTS = (".experts.gate_up_proj", ".experts.down_proj")
_NOT_PACKED_OWNERS = ("norm", "layernorm", "conv1d")  # RMSNorm, GatedRMSNorm, Conv1d
INDEX_BYTES = 8  # an input gather's values are int64
INDEX_DTYPE = "int64"


class SpecSource(Protocol):
    """What accounting reads of a tensor source (a GGUF table or source, random weights …)."""

    def names(self) -> set[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def is_quantized(self, name: str) -> bool: ...  # packed sources also report source_bytes(name)


def holds_packed(name: str) -> bool:
    """True when the module owning parameter ``name`` (our naming) can hold packed weights: every
    ``Linear`` / ``Embedding`` weight and the stacked experts; never norms, the conv1d, biases,
    ``dt_bias`` or ``A_log``."""
    if name.endswith(_EXPERTS):
        return True
    owner, _, leaf = name.rpartition(".")
    return leaf == "weight" and not owner.rpartition(".")[2].endswith(_NOT_PACKED_OWNERS)


def _block_index(name: str) -> int | None:
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else None


def input_index_bytes(source: SpecSource, name: str) -> int:
    """Bytes of the int64 input gather a packed weight keeps beside its blocks (a value-head column
    permutation: ``PackedWeight.input_index``); 0 for sources that never make one."""
    get = getattr(source, "input_index_elements", None)
    return INDEX_BYTES * int(get(name)) if callable(get) else 0


def resident_parts(source: SpecSource, name: str, run_dtype: str, owner_name: str | None = None) -> dict[str, int]:
    """Bytes ``name`` takes on its device, by kind: the file's blocks under their type's name (``q4_k``)
    when kept packed by ``owner_name``'s module (default: ``name`` itself), plus ``int64`` for an input
    gather; else the run dtype's name, dense."""
    if holds_packed(owner_name or name) and source.is_quantized(name):
        parts = {_type_label(source, name): int(source.source_bytes(name))}  # type: ignore[attr-defined]
        index = input_index_bytes(source, name)
        return parts | ({INDEX_DTYPE: index} if index else {})
    return {run_dtype: math.prod(source.shape(name)) * activation_bytes(run_dtype)}


def resident_bytes(source: SpecSource, name: str, run_dtype: str, owner_name: str | None = None) -> int:
    """All bytes ``name`` takes on its device (:func:`resident_parts`)."""
    return sum(resident_parts(source, name, run_dtype, owner_name).values())


def resident_by_dtype(config: ModelConfig, source: SpecSource, run_dtype: str) -> dict[str, int]:
    """Every weight byte of ``source`` loaded at ``run_dtype`` on one stage holding the whole model, by
    kind (:func:`resident_parts`), plus the rotary frequency table (``f32``): what the certificate
    charges, summed per dtype (the test of charged = resident compares this with the loaded tensors)."""
    out: dict[str, int] = defaultdict(int)
    names = source.names()
    for tensor in names:
        for kind, nbytes in resident_parts(source, tensor, run_dtype).items():
            out[kind] += nbytes
    out["f32"] += rope_table_bytes(config)
    return dict(out)


def spec_from_source(config: ModelConfig, source: SpecSource, run_dtype: str, name: str,
                     label_format: str | None = None) -> ModelSpec:
    """Exact resident bytes per block, entry and exit for ``source`` loaded at ``run_dtype``
    (``f32``/``bf16``/``f16``); the format is ``label_format`` if given, else the file's most
    common packed type when any tensor stays packed, else the run dtype."""
    by_block = dict.fromkeys(range(config.num_layers), 0)
    entry = exit_ = 0
    packed_elements: dict[str, int] = defaultdict(int)
    for tensor in source.names():
        nbytes = resident_bytes(source, tensor, run_dtype)
        if holds_packed(tensor) and source.is_quantized(tensor):
            packed_elements[_type_label(source, tensor)] += math.prod(source.shape(tensor))
        block = _block_index(tensor)
        if block is not None:
            by_block[block] += nbytes
        elif tensor.startswith("model.embed_tokens."):
            entry += nbytes
        else:
            exit_ += nbytes
    if config.tie_word_embeddings and EMBEDDING in source.names():
        # the head reads the embedding, held as the head would hold it (packed when stored packed)
        exit_ += resident_bytes(source, EMBEDDING, run_dtype, owner_name="lm_head.weight")
    fmt = label_format or (max(packed_elements, key=packed_elements.__getitem__) if packed_elements else run_dtype)
    spec = ModelSpec.from_config(config, _spec_format(fmt), name=name, tensor_bytes_by_block=by_block,
                                 entry_bytes=entry, exit_bytes=exit_)
    return replace(spec, format=fmt)


def _type_label(source: SpecSource, tensor: str) -> str:
    parts = getattr(source, "part_types", None)
    if callable(parts):
        return format_name(parts(tensor)[0])
    single = getattr(source, "ggml_type", None)
    if callable(single):
        return format_name(single(tensor))
    return str(getattr(source, "fmt", "packed"))


def _spec_format(fmt: str) -> str:
    """A preset name for the read-per-token estimate (exact bytes replace its weights)."""
    try:
        return preset(fmt).name
    except ConfigError:  # a label such as "packed": the estimate's format does not matter
        return "q8_0"


def source_expansions(source: SpecSource, run_dtype: str) -> list[Expansion]:
    """Tensors of ``source`` stored in an expanded type (:data:`~stagewise.spec.packed_types.EXPANDED`),
    by type, with the bytes their dequantization adds."""
    get = getattr(source, "part_types", None)
    if not callable(get):
        return []
    dense = activation_bytes(run_dtype)
    found: dict[GGMLQuantizationType, list[int]] = defaultdict(lambda: [0, 0])
    for tensor in source.names():
        types = get(tensor)
        if any(is_expanded(t) for t in types):
            entry = found[next(t for t in types if is_expanded(t))]
            entry[0] += 1
            entry[1] += math.prod(source.shape(tensor)) * dense - int(source.source_bytes(tensor))  # type: ignore[attr-defined]
    return [Expansion(t.name, n, extra) for t, (n, extra) in sorted(found.items(), key=lambda kv: kv[0].name)]


def resident_spec_for_format(config: ModelConfig, fmt: str, run_dtype: str, name: str) -> ModelSpec:
    """The spec of ``config`` stored as a ``fmt`` file (llama.cpp's per-tensor types for that preset,
    :mod:`stagewise.spec.quant_presets`) and loaded at ``run_dtype``: packed tensors charged their
    file bytes, everything else (expanded IQ types too) dense at the run dtype."""
    p, model, dense = preset(fmt), QuantModel.from_config(config), activation_bytes(run_dtype)
    by_block = {i: sum(shape_bytes(t, p, model, i, dense) + _index_bytes(config, t, part_types(t, p, model, i))
                       for t in block_tensors(config, i))
                for i in range(config.num_layers)}
    entry = sum(shape_bytes(t, p, model, None, dense) for t in entry_tensors(config))
    exit_ = sum(shape_bytes(t, p, model, None, dense) for t in exit_tensors(config))
    spec = ModelSpec.from_config(config, p.name, name=name, tensor_bytes_by_block=by_block, entry_bytes=entry,
                                 exit_bytes=exit_)
    return replace(spec, expanded=tuple(format_expansions(config, p.name, run_dtype)))


def _index_bytes(config: ModelConfig, t: TensorShape, types: list[GGMLQuantizationType]) -> int:
    """The int64 input gather a ``fmt`` file's packed (non-Q8_0) ``out_proj`` gets on loading when the
    value heads are permuted by column (``GGUFTable.input_index_elements``, from the config alone)."""
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    if t.name != "out_proj" or not nk or nv == nk or not keeps_packed(t, types) or types[0] == GGMLQuantizationType.Q8_0:
        return 0
    return INDEX_BYTES * t.shape[-1]


def format_expansions(config: ModelConfig, fmt: str, run_dtype: str) -> list[Expansion]:
    """What a ``fmt`` file of ``config`` dequantizes at load (expanded IQ types), by type."""
    p, model, dense = preset(fmt), QuantModel.from_config(config), activation_bytes(run_dtype)
    found: dict[GGMLQuantizationType, list[int]] = defaultdict(lambda: [0, 0])
    tensors: list[tuple[TensorShape, int | None]] = [(t, None) for t in entry_tensors(config) + exit_tensors(config)]
    tensors += [(t, i) for i in range(config.num_layers) for t in block_tensors(config, i)]
    for t, block in tensors:
        types = part_types(t, p, model, block)
        for (_, shape), ty in zip(t.parts, types, strict=True):
            if is_expanded(ty):
                found[ty][0] += 1
                found[ty][1] += math.prod(shape) * dense - stored_bytes(shape, ty)
    return [Expansion(t.name, n, extra) for t, (n, extra) in sorted(found.items(), key=lambda kv: kv[0].name)]


def random_spec(config: ModelConfig, fmt: str, run_dtype: str, name: str) -> ModelSpec:
    """The spec of ``random:PRESET@fmt`` (:class:`~stagewise.weights.random_source.RandomSource`'s
    rule): projections, experts and an untied head drawn packed in ``fmt`` where rows divide into
    its blocks (a mix, ``q4_k_m``: in the type a file of that mix stores each in, where its parts agree);
    embeddings, norms, the router, the shared-expert gate and the conv1d dense."""
    if fmt == "dense":
        return ModelSpec.from_config(config, run_dtype, name=name)
    p = preset(fmt)
    qtype = p.default
    mix = p.mix and fmt != format_name(qtype)  # q4_k_m: llama.cpp's per-tensor types (RandomSource.MIXES)
    model = QuantModel.from_config(config)
    dense = activation_bytes(run_dtype)

    def nbytes(t: TensorShape, block: int | None) -> int:
        if t.role not in ("matrix", "expert", "head") or len(t.shape) < 2:
            return t.elements * dense
        if mix:  # drawn packed where every stored part has one packed type, as make-model's file of the mix loads
            types = [GGMLQuantizationType.F32 if part in KEEP_F32 else ty
                     for (part, _), ty in zip(t.parts, part_types(t, p, model, block), strict=True)]
            packed = len(set(types)) == 1 and is_packed(types[0])
            return math.prod(t.shape[:-1]) * row_bytes(types[0], t.shape[-1]) if packed else t.elements * dense
        if t.shape[-1] % block_elements(qtype) == 0:
            return math.prod(t.shape[:-1]) * row_bytes(qtype, t.shape[-1])
        return t.elements * dense

    by_block = {i: sum(nbytes(t, i) for t in block_tensors(config, i)) for i in range(config.num_layers)}
    spec = ModelSpec.from_config(config, p.name, name=name, tensor_bytes_by_block=by_block,
                                 entry_bytes=sum(nbytes(t, None) for t in entry_tensors(config)),
                                 exit_bytes=sum(nbytes(t, None) for t in exit_tensors(config)))
    return replace(spec, format=fmt)
