"""Resident weight bytes per tensor, block, entry and exit in a stored format.

Rules (docs/accounting.md):

* float formats (``f32``/``f16``/``bf16``): every tensor in that dtype, as HF checkpoints are.
* quantized formats: big matrices, routed experts and the token embedding in the format
  (llama.cpp keeps ``token_embd`` of a q8_0 file in q8_0, as Unsloth's UD files do);
  1-D tensors (norms, biases, dt_bias, A_log), the MoE router, the shared-expert gate and
  the depthwise conv1d stay f32, as llama.cpp's quantizer leaves them.
* the LM head of a 2–5 bit file is q6_k (llama.cpp's rule for ``output.weight``).
"""

from __future__ import annotations

from stagewise.spec.formats import FORMATS, StoredFormat, tensor_bytes
from stagewise.spec.tensor_shapes import TensorShape

_F32_ROLES = frozenset({"vector", "router", "conv"})
_HEAD_UPGRADE = frozenset({"q2_k", "q3_k", "q4_0", "q4_1", "q4_k", "q5_0", "q5_1", "q5_k"})


def format_for(role: str, fmt: StoredFormat) -> StoredFormat:
    """The format a tensor of ``role`` is stored in when the file's format is ``fmt``."""
    if not fmt.quantized:
        return fmt
    if role in _F32_ROLES:
        return FORMATS["f32"]
    if role == "head" and fmt.name in _HEAD_UPGRADE:
        return FORMATS["q6_k"]
    return fmt


def shape_bytes(t: TensorShape, fmt: StoredFormat) -> int:
    """Resident bytes of tensor ``t`` in a file of format ``fmt``."""
    return tensor_bytes(t.shape, format_for(t.role, fmt))


def total_bytes(tensors: list[TensorShape], fmt: StoredFormat) -> int:
    return sum(shape_bytes(t, fmt) for t in tensors)


def split_expert_bytes(tensors: list[TensorShape], fmt: StoredFormat) -> tuple[int, int]:
    """(bytes of routed-expert tensors, bytes of everything else)."""
    expert = sum(shape_bytes(t, fmt) for t in tensors if t.role == "expert")
    return expert, total_bytes(tensors, fmt) - expert
