"""stagewise.spec: ModelSpec and the memory accounting (no torch).

Public API::

    ModelSpec.from_config(config, fmt, name="", tensor_bytes_by_block=None) -> ModelSpec
    load_model_spec(path, fmt=None) -> ModelSpec
    stage_charge(spec, profile, start, end, entry, exit) -> Charge
"""

from __future__ import annotations

from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.charge import Charge, stage_charge
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import DEFAULT_CONTEXT_TOKENS, Profile

__all__ = ["DEFAULT_CONTEXT_TOKENS", "BlockSpec", "Charge", "EndSpec", "ModelSpec", "Profile", "stage_charge"]
