"""State bytes per block: the KV cache and the linear-attention conv / recurrent state.

These are the runtime's allocations (docs/accounting.md), compared after loading:

* attention block: KV pool ``(pool blocks + 1 scratch) x block_tokens x kv_values_per_token``
  in the activation dtype (``kv_values_per_token`` = 2 (key + value) x num_kv_heads x head_dim);
  the pool holds ``batch x context`` positions unless the profile sizes it (``kv_tokens``).
* Gated DeltaNet block: entry pools (``models/state_slots.py``; :func:`state_entries`: one zero entry, a
  published and a provisional entry per sequence row, and the prefix cache's snapshots,
  ``profile.prefix_snapshots``), each a conv state ``conv_dim x kernel`` in the activation dtype and a
  recurrent state ``num_v_heads x key_head_dim x value_head_dim`` in float32.
* fp8 KV (``kv_dtype="fp8"``): one byte a key or value element, plus a float32 scale per position and
  KV head for keys and for values.
"""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, SCRATCH_BLOCKS, kv_scale_bytes
from stagewise.spec.profile import Profile

F32_BYTES = 4


def recurrent_entries(rows: int, snapshots: int = 0) -> int:
    """Entries each linear-attention pool holds (``models/state_slots.py``): the zero entry, published +
    provisional per row, and the prefix snapshots."""
    return 1 + 2 * rows + snapshots  # zero entry + (published + provisional) per row + snapshots


def state_entries(profile: Profile) -> int:
    """Entries of each linear-attention pool under ``profile`` (:func:`recurrent_entries`)."""
    return recurrent_entries(profile.batch, profile.prefix_snapshots)


def kv_bytes_per_position(block: BlockSpec, profile: Profile) -> int:
    """Bytes one position of one sequence takes in the block's KV pool: keys and values in the KV
    dtype, plus their per-head scales (fp8)."""
    scales = 2 * block.kv_heads * kv_scale_bytes(profile.kv_storage)  # key + value
    return block.kv_values_per_token * profile.kv_element_bytes + scales


def kv_pool_bytes(block: BlockSpec, profile: Profile) -> int:
    """The block's KV pool on its stage: every block of the pool, the scratch block included."""
    blocks = profile.kv_pool_blocks + SCRATCH_BLOCKS
    return blocks * KV_BLOCK_TOKENS * kv_bytes_per_position(block, profile)


def kv_context_bytes(block: BlockSpec, profile: Profile) -> int:
    """KV of ``batch`` sequences at full context: what a decode step reads (the cost model's figure)."""
    return profile.batch * profile.context_tokens * kv_bytes_per_position(block, profile)


def conv_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return state_entries(profile) * block.conv_state_values * profile.activation_bytes


def recurrent_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return state_entries(profile) * block.recurrent_state_values * F32_BYTES


def block_state_bytes(block: BlockSpec, profile: Profile) -> int:
    """All state block ``block`` keeps on its device for ``profile``."""
    return kv_pool_bytes(block, profile) + conv_state_bytes(block, profile) + recurrent_state_bytes(block, profile)
