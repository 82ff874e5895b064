"""State bytes per block: the KV cache and the linear-attention conv / recurrent state.

These are the runtime's allocations (docs/accounting.md), compared after loading:

* attention block: KV pool ``(pool blocks + 1 scratch) x block_tokens x kv_values_per_token``
  in the activation dtype (``kv_values_per_token`` = 2 (key + value) x num_kv_heads x head_dim);
  the pool holds ``batch x context`` positions unless the profile sizes it (``kv_tokens``).
* Gated DeltaNet block: entry pools (``models/state_slots.py``) of conv state ``conv_dim x kernel``
  in the activation dtype and recurrent state ``num_v_heads x key_head_dim x value_head_dim`` in
  float32 per entry; ``1 + 2 x batch`` entries (the zero entry, then published + provisional per
  row, so a step can be rolled back).
"""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, SCRATCH_BLOCKS
from stagewise.spec.profile import Profile

F32_BYTES = 4


def state_entries(profile: Profile) -> int:
    """Entries each linear-attention pool holds: the zero entry, and published + provisional per row."""
    return 1 + 2 * profile.batch  # zero entry + (published + provisional) per sequence row


def kv_pool_bytes(block: BlockSpec, profile: Profile) -> int:
    """The block's KV pool on its stage: every block of the pool, the scratch block included."""
    blocks = profile.kv_pool_blocks + SCRATCH_BLOCKS
    return blocks * KV_BLOCK_TOKENS * block.kv_values_per_token * profile.activation_bytes


def kv_context_bytes(block: BlockSpec, profile: Profile) -> int:
    """KV of ``batch`` sequences at full context: what a decode step reads (the cost model's figure)."""
    return profile.batch * profile.context_tokens * block.kv_values_per_token * profile.activation_bytes


def conv_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return state_entries(profile) * block.conv_state_values * profile.activation_bytes


def recurrent_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return state_entries(profile) * block.recurrent_state_values * F32_BYTES


def block_state_bytes(block: BlockSpec, profile: Profile) -> int:
    """All state block ``block`` keeps on its device for ``profile``."""
    return kv_pool_bytes(block, profile) + conv_state_bytes(block, profile) + recurrent_state_bytes(block, profile)
