"""Stored weight formats: how many bytes a tensor of a given shape occupies.

Quantized formats store fixed-size blocks along each row (llama.cpp / GGML layouts):
``q8_0`` is 32 int8 + one f16 scale = 34 bytes per 32 elements; k-quants use 256-element
super-blocks. A row whose length is not a multiple of the block is stored in f16 instead
(llama.cpp falls back to a compatible type; f16 is the conservative choice).
"""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.errors import ConfigError


@dataclass(frozen=True)
class StoredFormat:
    """``block_bytes`` bytes hold ``block_elements`` consecutive elements of one row."""

    name: str
    block_elements: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        return self.block_elements > 1


FORMATS: dict[str, StoredFormat] = {
    f.name: f
    for f in (
        StoredFormat("f32", 1, 4),
        StoredFormat("f16", 1, 2),
        StoredFormat("bf16", 1, 2),
        StoredFormat("q8_0", 32, 34),  # 32 x int8 + f16 scale
        StoredFormat("q5_1", 32, 24),  # 32 x 5 bit + f16 scale + f16 min
        StoredFormat("q5_0", 32, 22),  # 32 x 5 bit + f16 scale
        StoredFormat("q4_1", 32, 20),  # 32 x 4 bit + f16 scale + f16 min
        StoredFormat("q4_0", 32, 18),  # 32 x 4 bit + f16 scale
        StoredFormat("q6_k", 256, 210),
        StoredFormat("q5_k", 256, 176),
        StoredFormat("q4_k", 256, 144),
        StoredFormat("q3_k", 256, 110),
        StoredFormat("q2_k", 256, 84),
    )
}
ACTIVATION_DTYPES: dict[str, int] = {"f32": 4, "f16": 2, "bf16": 2}  # bytes per element
_ALIASES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "fp32": "f32", "fp16": "f16"}


def stored_format(name: str) -> StoredFormat:
    """Look up a format by name (case-insensitive; ``bfloat16`` etc. accepted)."""
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise ConfigError(f"format {name!r} is not supported (supported: {', '.join(FORMATS)})")
    return FORMATS[key]


def activation_bytes(dtype: str) -> int:
    """Bytes per element of an activation dtype (``bf16``, ``f16``, ``f32``)."""
    key = _ALIASES.get(dtype.lower(), dtype.lower())
    if key not in ACTIVATION_DTYPES:
        raise ConfigError(f"activation dtype {dtype!r} must be one of {', '.join(ACTIVATION_DTYPES)}")
    return ACTIVATION_DTYPES[key]


def tensor_bytes(shape: tuple[int, ...], fmt: StoredFormat) -> int:
    """Bytes of a tensor of ``shape`` stored in ``fmt`` (rows along the last dimension)."""
    row = shape[-1] if shape else 1
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    if fmt.quantized and row % fmt.block_elements != 0:
        fmt = FORMATS["f16"]
    blocks_per_row = -(-row // fmt.block_elements)  # ceil
    return rows * blocks_per_row * fmt.block_bytes
