"""check_block_scales: refuse packed blocks whose scales are NaN or infinite, at load.

A packed tensor is used as the file holds it, so a non-finite block scale would turn into NaN
logits at run time. Every packed type's scale fields (f16 ``d``/``dmin``; MXFP4's E8M0 exponent,
where 0xFF means NaN) are checked on the device the blocks were copied to, one reduction per tensor.
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.errors import CorruptModelFile
from stagewise.spec.packed_types import block_bytes

T = GGMLQuantizationType
# byte offsets of the f16 scale fields inside one block, per type (gguf.quants' block layouts)
F16_SCALE_OFFSETS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
    T.IQ4_NL: (0,), T.IQ4_XS: (0,),
}
E8M0_NAN = 0xFF  # MXFP4's shared exponent byte (offset 0) that encodes NaN


def check_block_scales(raw: torch.Tensor, ggml_type: GGMLQuantizationType, label: str, tensor: str) -> None:
    """Raise :class:`CorruptModelFile` naming ``tensor`` when any block of ``raw`` (its bytes, any shape)
    has a NaN or infinite scale."""
    blocks = raw.reshape(-1, block_bytes(ggml_type))
    if ggml_type == T.MXFP4:
        bad = bool((blocks[:, 0] == E8M0_NAN).any())
    else:
        offsets = F16_SCALE_OFFSETS.get(ggml_type, ())
        bad = any(not bool(torch.isfinite(blocks[:, o : o + 2].contiguous().view(torch.float16)).all())
                  for o in offsets)
    if bad:
        raise CorruptModelFile(f"{label}: tensor {tensor!r} ({ggml_type.name}) has a NaN or infinite block scale")
