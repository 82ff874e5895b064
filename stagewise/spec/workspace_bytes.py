"""Workspace bytes: activations of one prefill chunk, handoff buffers and the logits buffer.

Blocks run one after another, so a stage needs the largest block's activations, not the sum:
``step tokens x (activation values x dtype bytes + fp32 router values x 4 + heads x context
x 4 for the fp32 attention-score chunk)``, where a step carries at most ``max(chunk, batch)``
tokens (one sequence's prefill chunk, or one decode token per sequence). Every stage also holds
an input and an output hidden-state buffer (``2 x step tokens x hidden``); the exit stage holds
the fp32 logits buffer ``step tokens x vocab x 4``. A stage of a quantized model also holds the
dense tile its packed matmuls dequantize at a time (:func:`dequant_tile_bytes`).
"""

from __future__ import annotations

from stagewise.errors import ConfigError
from stagewise.spec.block_spec import BlockSpec
from stagewise.spec.packed_types import DEVICE_TILE_ELEMENTS, TILE_ELEMENTS
from stagewise.spec.profile import Profile
from stagewise.spec.quant_presets import preset

F32_BYTES = 4
HANDOFF_BUFFERS = 2  # hidden state in + hidden state out


def block_workspace_bytes(block: BlockSpec, profile: Profile) -> int:
    """Peak activation bytes while block ``block`` ingests one prefill chunk."""
    tokens = profile.step_tokens
    per_token = (
        block.activation_values_per_token * profile.activation_bytes
        + block.f32_values_per_token * F32_BYTES
        + block.score_values_per_position * profile.context_tokens * F32_BYTES
    )
    return tokens * per_token


def handoff_buffer_bytes(hidden_size: int, profile: Profile) -> int:
    """Per stage: the in/out activation buffers, plus the device runtime's own workspace
    (``profile.runtime_workspace_bytes``: BLAS workspaces and CUDA-graph pools on accelerators)."""
    buffers = HANDOFF_BUFFERS * profile.step_tokens * hidden_size * profile.activation_bytes
    return buffers + profile.runtime_workspace_bytes


def logits_buffer_bytes(vocab_size: int, profile: Profile) -> int:
    return profile.step_tokens * vocab_size * F32_BYTES


def dequant_tile_bytes(fmt: str, profile: Profile) -> int:
    """Per stage of a model stored in ``fmt``: the dense tile (activation dtype) a packed matmul of
    many rows dequantizes at a time — ``DEVICE_TILE_ELEMENTS`` values on accelerators (profiles with
    a runtime workspace), ``TILE_ELEMENTS`` on CPUs; none for a dense format."""
    try:
        quantized = preset(fmt).quantized
    except ConfigError:  # a label of packed types the presets do not name (a GGUF file's): quantized
        quantized = True
    if not quantized:
        return 0
    values = DEVICE_TILE_ELEMENTS if profile.runtime_workspace_bytes else TILE_ELEMENTS
    return values * profile.activation_bytes
