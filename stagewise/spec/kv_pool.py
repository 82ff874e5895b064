"""KV pool geometry: keys and values are stored in fixed-size blocks of ``KV_BLOCK_TOKENS`` positions.

One pool per stage, the same number of blocks on every stage (block ids are the pipeline's, not a
stage's), plus one scratch block that padding rows and unassigned block-table entries point at.
The planner, the runtime and the batcher's allocator all size the pool with these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

# 64 positions: the decode attention kernel's key tile (BLOCK_KEYS), so each tile of a split is
# exactly one block and costs one block-table lookup; a power of two, so p // 64 and p % 64 are
# shifts; and 64 positions waste at most 63 per sequence (< 2% of a 4,096-token context).
KV_BLOCK_TOKENS = 64
SCRATCH_BLOCKS = 1  # where padding rows write and unassigned table entries point (never attended)

# How keys and values are stored: in an activation dtype, or float8 e4m3 with one float32 scale per
# position and KV head (keys and values each: amax / 448 of that head's head_dim values)
KV_DTYPES = ("bf16", "f16", "f32", "fp8")
_KV_ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "fp8": 1}
FP8_SCALE_BYTES = 4  # float32


def kv_element_bytes(kv_dtype: str) -> int:
    """Bytes of one stored key or value element."""
    return _KV_ELEMENT_BYTES[kv_dtype]


def kv_scale_bytes(kv_dtype: str) -> int:
    """Bytes of the scale kept per position and KV head, for keys and for values each (fp8 only)."""
    return FP8_SCALE_BYTES if kv_dtype == "fp8" else 0


def blocks_for(tokens: int, block_tokens: int = KV_BLOCK_TOKENS) -> int:
    """Blocks that hold ``tokens`` positions (rounded up)."""
    return -(-tokens // block_tokens)


def default_pool_blocks(rows: int, context_tokens: int, block_tokens: int = KV_BLOCK_TOKENS) -> int:
    """The pool that gives every row its whole context (the memory of a dense per-row cache)."""
    return rows * blocks_for(context_tokens, block_tokens)


@dataclass(frozen=True)
class KVPool:
    """A pipeline's KV pool: ``blocks`` usable blocks of ``block_tokens`` positions on every stage,
    at most ``blocks_per_row`` per sequence row (its context)."""

    blocks: int
    block_tokens: int
    blocks_per_row: int

    def __post_init__(self) -> None:
        if self.blocks < 1 or self.block_tokens < 1 or self.blocks_per_row < 1:
            raise ValueError(f"a KV pool needs positive sizes, got {self}")

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_tokens
