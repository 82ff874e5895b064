"""State bytes per block: the KV cache and the linear-attention conv / recurrent state.

These are the runtime's allocations (docs/accounting.md), compared after loading:

* attention block: KV cache ``2 (key + value) x batch x num_kv_heads x context x head_dim``
  in the activation dtype (``kv_values_per_token`` = 2 x num_kv_heads x head_dim).
* Gated DeltaNet block: conv state ``batch x conv_dim x kernel`` in the activation dtype and
  recurrent state ``batch x num_v_heads x key_head_dim x value_head_dim`` in float32, each
  double-buffered (x2) so a step can be rolled back.
"""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.profile import Profile

DOUBLE_BUFFER = 2  # provisional + published copy (transactional steps)
F32_BYTES = 4


def kv_cache_bytes(block: BlockSpec, profile: Profile) -> int:
    return profile.batch * profile.context_tokens * block.kv_values_per_token * profile.activation_bytes


def conv_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return DOUBLE_BUFFER * profile.batch * block.conv_state_values * profile.activation_bytes


def recurrent_state_bytes(block: BlockSpec, profile: Profile) -> int:
    return DOUBLE_BUFFER * profile.batch * block.recurrent_state_values * F32_BYTES


def block_state_bytes(block: BlockSpec, profile: Profile) -> int:
    """All state block ``block`` keeps on its device for ``profile``."""
    return kv_cache_bytes(block, profile) + conv_state_bytes(block, profile) + recurrent_state_bytes(block, profile)
