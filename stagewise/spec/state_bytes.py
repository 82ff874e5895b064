"""State bytes per block: the KV cache and the linear-attention conv / recurrent state.

These are the runtime's allocations (docs/accounting.md), compared after loading:

* attention block: KV pool ``(pool blocks + 1 scratch) x block_tokens x kv_values_per_token``
  in the activation dtype (``kv_values_per_token`` = 2 (key + value) x num_kv_heads x head_dim);
  the pool holds ``batch x context`` positions unless the profile sizes it (``kv_tokens``).
* Gated DeltaNet block: conv state ``batch x conv_dim x kernel`` in the activation dtype and
  recurrent state ``batch x num_v_heads x key_head_dim x value_head_dim`` in float32, each
  double-buffered (x2) so a step can be rolled back.
"""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, SCRATCH_BLOCKS
from stagewise.spec.profile import Profile

DOUBLE_BUFFER = 2  # provisional + published copy (transactional steps)
F32_BYTES = 4


def kv_pool_bytes(block: BlockSpec, profile: Profile) -> int:
    """The block's KV pool on its stage: every block of the pool, the scratch block included."""
    blocks = profile.kv_pool_blocks + SCRATCH_BLOCKS
    return blocks * KV_BLOCK_TOKENS * block.kv_values_per_token * profile.activation_bytes


def kv_context_bytes(block: BlockSpec, profile: Profile) -> int:
    """KV of ``batch`` sequences at full context: what a decode step reads (the cost model's figure)."""
    return profile.batch * profile.context_tokens * block.kv_values_per_token * profile.activation_bytes


def conv_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return DOUBLE_BUFFER * profile.batch * block.conv_state_values * profile.activation_bytes


def recurrent_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return DOUBLE_BUFFER * profile.batch * block.recurrent_state_values * F32_BYTES


def block_state_bytes(block: BlockSpec, profile: Profile) -> int:
    """All state block ``block`` keeps on its device for ``profile``."""
    return kv_pool_bytes(block, profile) + conv_state_bytes(block, profile) + recurrent_state_bytes(block, profile)
