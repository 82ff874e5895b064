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

from dataclasses import dataclass

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


@dataclass(frozen=True)
class PlaneLayout:
    """How a packed type's blocks are held on a device: as three planes, each block's bytes split by field.

    ``qs`` is the byte range of a block's low quant bits (nibbles, 2-bit fields, Q8_0's int8), ``qh`` the
    range of its high bits (empty where the type has none); the **meta** plane takes every other byte of
    the block (scales, mins, codes), in file order. A row of ``n`` blocks becomes ``n * len(qs)`` bytes of
    quants, ``n * len(qh)`` of high bits and ``n * meta_bytes`` of meta, each in block order: the same
    bytes as the file's (nothing added, nothing changed), so a plane row is a power-of-two-friendly run of
    quants and the repack is undone exactly (``weights/quant/packed_planes.py``)."""

    block_bytes: int
    qs: tuple[int, int]
    qh: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        (a, b), (c, d) = self.qs, self.qh
        if not (0 <= a < b <= self.block_bytes and 0 <= c <= d <= self.block_bytes) or (c < d and c < b and a < d):
            raise ValueError(f"plane ranges {self.qs}, {self.qh} do not fit a {self.block_bytes}-byte block")

    @property
    def qs_bytes(self) -> int:
        return self.qs[1] - self.qs[0]

    @property
    def qh_bytes(self) -> int:
        return self.qh[1] - self.qh[0]

    @property
    def meta_bytes(self) -> int:
        return self.block_bytes - self.qs_bytes - self.qh_bytes

    def meta_ranges(self) -> tuple[tuple[int, int], ...]:
        """The block's byte ranges that form its meta plane entry, in file order."""
        cuts = sorted(r for r in (self.qs, self.qh) if r[1] > r[0])
        ranges, at = [], 0
        for lo, hi in cuts:
            if lo > at:
                ranges.append((at, lo))
            at = hi
        if at < self.block_bytes:
            ranges.append((at, self.block_bytes))
        return tuple(ranges)

    def meta_offset(self, file_offset: int) -> int:
        """Where the block's byte ``file_offset`` (a meta byte) sits in its meta entry."""
        at = 0
        for lo, hi in self.meta_ranges():
            if lo <= file_offset < hi:
                return at + file_offset - lo
            at += hi - lo
        raise ValueError(f"byte {file_offset} is a quant byte, not meta")


# gguf.quants' block layouts: (bytes, quant range, high-bit range); the rest is meta
PLANES: dict[GGMLQuantizationType, PlaneLayout] = {
    T.Q4_0: PlaneLayout(18, (2, 18)),  # d | qs[16]
    T.Q4_1: PlaneLayout(20, (4, 20)),  # d, m | qs[16]
    T.Q5_0: PlaneLayout(22, (6, 22), (2, 6)),  # d | qh[4] | qs[16]
    T.Q5_1: PlaneLayout(24, (8, 24), (4, 8)),  # d, m | qh[4] | qs[16]
    T.Q8_0: PlaneLayout(34, (2, 34)),  # d | qs[32] (int8)
    T.Q2_K: PlaneLayout(84, (16, 80)),  # scales[16] | qs[64] | d, dmin
    T.Q3_K: PlaneLayout(110, (32, 96), (0, 32)),  # hmask[32] | qs[64] | scales[12], d
    T.Q4_K: PlaneLayout(144, (16, 144)),  # d, dmin, scales[12] | qs[128]
    T.Q5_K: PlaneLayout(176, (48, 176), (16, 48)),  # d, dmin, scales[12] | qh[32] | qs[128]
    T.Q6_K: PlaneLayout(210, (0, 128), (128, 192)),  # ql[128] | qh[64] | scales[16], d
    T.IQ4_NL: PlaneLayout(18, (2, 18)),  # d | qs[16]
    T.IQ4_XS: PlaneLayout(136, (8, 136)),  # d, scales_h, scales_l[4] | qs[128]
    T.MXFP4: PlaneLayout(17, (1, 17)),  # e | qs[16]
}


def plane_row_bytes(ggml_type: GGMLQuantizationType, row_elements: int) -> tuple[int, int, int]:
    """Bytes of one row's ``(qs, qh, meta)`` planes; they sum to :func:`row_bytes`."""
    layout = PLANES[ggml_type]
    blocks = row_elements // block_elements(ggml_type)
    return blocks * layout.qs_bytes, blocks * layout.qh_bytes, blocks * layout.meta_bytes


def format_name(ggml_type: GGMLQuantizationType) -> str:
    """Lower-case name used in plans, banners and ``--format`` (``q4_k``, ``iq4_xs``, ``bf16``)."""
    return ggml_type.name.lower()
