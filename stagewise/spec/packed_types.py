"""The one table of GGUF tensor types: what each is resident as on a device (torch-free).

Every type a GGUF tensor may carry falls in exactly one class:

* **dense** (F32, F16, BF16): read as the values they are, cast to the run dtype (F32 kept for
  norms and other tensors the model computes in float32);
* **packed** (Q4_0 … Q8_0, Q2_K … Q6_K, IQ4_NL, IQ4_XS, MXFP4): resident as the file's blocks,
  byte for byte (:class:`~stagewise.weights.quant.packed_weight.PackedWeight`, Q8_0 as
  :class:`~stagewise.weights.quant.q8_0.Q8_0Weight`); charged their file bytes;
* **expanded** (the other IQ types, TQ1_0/TQ2_0): dequantized at load to the run dtype, charged at
  that dense size, and said so by ``assess`` and the load banner;
* anything else: :class:`~stagewise.errors.UnsupportedTensorType` naming tensor and type.

The planner (no torch), the loader and the kernels all read this table, so what is charged is what
is loaded.
"""

from __future__ import annotations

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

DENSE: frozenset[GGMLQuantizationType] = frozenset({T.F32, T.F16, T.BF16})
PACKED: frozenset[GGMLQuantizationType] = frozenset({
    T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
    T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
    T.IQ4_NL, T.IQ4_XS, T.MXFP4,
})
EXPANDED: frozenset[GGMLQuantizationType] = frozenset({
    T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.TQ1_0, T.TQ2_0,
})
SUPPORTED: frozenset[GGMLQuantizationType] = DENSE | PACKED | EXPANDED

# A packed matmul of many rows dequantizes a bounded tile of the weight at a time, then multiplies it
# densely: values a tile (in the activation dtype), charged as workspace on every stage of a quantized model
TILE_ELEMENTS = 1 << 22  # CPU: 8 MiB at bf16
DEVICE_TILE_ELEMENTS = 1 << 24  # accelerators: 32 MiB at bf16 (bench/results/packed_h200_r2: 3-4x faster than 4M at 512 rows)
DEQUANT_MATMUL_MIN_ROWS = 128  # accelerators: from this many rows dequantized tiles + cuBLAS beat the fused GEMM


def block_elements(ggml_type: GGMLQuantizationType) -> int:
    """Values per block (1 for dense types)."""
    return GGML_QUANT_SIZES[ggml_type][0]


def block_bytes(ggml_type: GGMLQuantizationType) -> int:
    """Bytes per block (the element size for dense types)."""
    return GGML_QUANT_SIZES[ggml_type][1]


def row_bytes(ggml_type: GGMLQuantizationType, row_elements: int) -> int:
    """Bytes of one row of ``row_elements`` values (a whole number of blocks; the caller checks)."""
    return row_elements // block_elements(ggml_type) * block_bytes(ggml_type)


def is_packed(ggml_type: GGMLQuantizationType) -> bool:
    """True when a tensor of this type stays resident as the file's blocks."""
    return ggml_type in PACKED


def is_expanded(ggml_type: GGMLQuantizationType) -> bool:
    """True when a tensor of this type is dequantized at load (charged dense)."""
    return ggml_type in EXPANDED


def format_name(ggml_type: GGMLQuantizationType) -> str:
    """Lower-case name used in plans, banners and ``--format`` (``q4_k``, ``iq4_xs``, ``bf16``)."""
    return ggml_type.name.lower()
