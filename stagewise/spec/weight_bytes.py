"""Weight bytes per tensor, block, entry and exit: as stored in a file, and as resident after loading.

Rules (docs/accounting.md):

* a format is a preset of :mod:`stagewise.spec.quant_presets`: float formats (``f32``/``f16``/
  ``bf16``) store every tensor in that dtype, as HF checkpoints are; quantized ones (``q8_0``,
  ``q4_k_m``, ``iq4_xs`` …) give each GGUF tensor llama.cpp's type for that preset (1-D tensors,
  the router and the conv1d stay F32; the head Q6_K; ``attn_v`` / ``ffn_down`` upgrades …);
* **stored** bytes: each part in its type (whole blocks along the row);
* **resident** bytes (``dense_bytes`` given, the loader's rule): a matrix, routed expert stack,
  embedding, head or router whose parts are all one packed type of
  :mod:`stagewise.spec.packed_types` stays the file's blocks; everything else (1-D
  tensors, conv, F32/F16/BF16 parts, expanded IQ types, parts of mixed types) is dense at the run
  dtype, ``dense_bytes`` per value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gguf.constants import GGMLQuantizationType

from stagewise.spec.model_config import ModelConfig
from stagewise.spec.packed_types import is_packed, row_bytes
from stagewise.spec.quant_presets import Preset, QuantModel, tensor_type
from stagewise.spec.tensor_shapes import TensorShape


@dataclass(frozen=True)
class Expansion:
    """``tensors`` tensors of ``type_name`` dequantized at load: ``extra_bytes`` over their file bytes."""

    type_name: str
    tensors: int
    extra_bytes: int


HOLDS_PACKED = frozenset({"matrix", "expert", "embedding", "head", "router"})  # modules with packed weights


F32_BYTES = 4


def rope_table_bytes(config: ModelConfig) -> int:
    """The rotary frequencies every stage keeps (``inv_freq``, float32, one per rotated pair; a
    GGUF's ``rope_freqs`` factors are folded into them)."""
    return config.rotary_dim // 2 * F32_BYTES


def gguf_name(stored: str, block: int | None) -> str:
    return stored if block is None else f"blk.{block}.{stored}"


def part_types(t: TensorShape, fmt: Preset, model: QuantModel, block: int | None) -> list[GGMLQuantizationType]:
    """The stored type of each of ``t``'s GGUF parts in a ``fmt`` file."""
    return [tensor_type(fmt, gguf_name(name, block), shape, model) for name, shape in t.parts]


def stored_bytes(shape: tuple[int, ...], ggml_type: GGMLQuantizationType) -> int:
    """Bytes of a tensor of ``shape`` (row last) stored as ``ggml_type``."""
    row = shape[-1] if shape else 1
    return math.prod(shape[:-1]) * row_bytes(ggml_type, row)


def keeps_packed(t: TensorShape, types: list[GGMLQuantizationType]) -> bool:
    """The loader's rule: one packed type across all parts, held by a module that takes packed weights."""
    return t.role in HOLDS_PACKED and len(set(types)) == 1 and is_packed(types[0]) and len(t.shape) >= 2


def shape_bytes(t: TensorShape, fmt: Preset, model: QuantModel, block: int | None,
                dense_bytes: int | None = None) -> int:
    """Bytes of ``t`` in a ``fmt`` file (``dense_bytes`` None), or resident after loading at a run
    dtype of ``dense_bytes`` per value."""
    types = part_types(t, fmt, model, block)
    if dense_bytes is not None and not keeps_packed(t, types):
        return t.elements * dense_bytes
    return sum(stored_bytes(shape, ty) for (_, shape), ty in zip(t.parts, types, strict=True))


def total_bytes(tensors: list[TensorShape], fmt: Preset, model: QuantModel, block: int | None,
                dense_bytes: int | None = None) -> int:
    return sum(shape_bytes(t, fmt, model, block, dense_bytes) for t in tensors)


def split_expert_bytes(tensors: list[TensorShape], fmt: Preset, model: QuantModel, block: int | None,
                       dense_bytes: int | None = None) -> tuple[int, int]:
    """(bytes of routed-expert tensors, bytes of everything else)."""
    expert = sum(shape_bytes(t, fmt, model, block, dense_bytes) for t in tensors if t.role == "expert")
    return expert, total_bytes(tensors, fmt, model, block, dense_bytes) - expert
