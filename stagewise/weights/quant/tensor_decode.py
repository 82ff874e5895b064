"""Decode one GGUF tensor's bytes, dispatching on that tensor's own ggml type.

* F32, F16, BF16: reinterpret the bytes (zero-copy on CPU), then place on the device;
* Q8_0: resident packed (:class:`~stagewise.weights.quant.q8_0.Q8_0Weight`), or dequantized where
  a dense tensor is required (embeddings, norms);
* the other packed types (:data:`~stagewise.spec.packed_types.PACKED`): dequantized in
  torch on the target device where a dense tensor is asked for;
* the expanded types (IQ1_*, IQ2_*, IQ3_*, TQ1_0, TQ2_0): dequantized at load by ``gguf.quants`` on
  the CPU, a bounded slab of rows at a time, then placed on the device;
* anything else: :class:`~stagewise.errors.UnsupportedTensorType` naming the tensor and type.
"""

from __future__ import annotations

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.errors import UnsupportedTensorType
from stagewise.spec.packed_types import EXPANDED, SUPPORTED
from stagewise.weights.quant.dequant import dequantize, dequantize_expanded

DENSE_TYPES: dict[GGMLQuantizationType, torch.dtype] = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
SUPPORTED_TYPES = SUPPORTED


def check_supported(ggml_type: GGMLQuantizationType, label: str, tensor: str) -> None:
    """Raise :class:`UnsupportedTensorType` (one line naming ``label``, tensor and type) unless the
    type is in :data:`~stagewise.spec.packed_types.SUPPORTED`."""
    if ggml_type not in SUPPORTED_TYPES:
        supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise UnsupportedTensorType(f"{label}: tensor {tensor!r} has type {ggml_type.name} (supported: {supported})")


def decode_dense(raw: torch.Tensor, ggml_type: GGMLQuantizationType, shape: tuple[int, ...],
                 device: torch.device) -> torch.Tensor:
    """The tensor on ``device``: at its file dtype when dense, float32 when block-quantized.

    ``raw`` is the tensor's bytes (CPU ``uint8``, typically a view of the file mapping); on a CPU
    device a dense tensor stays a view of it (no copy).
    """
    dtype = DENSE_TYPES.get(ggml_type)
    if dtype is not None:
        return raw.view(dtype).reshape(shape).to(device)
    if ggml_type in EXPANDED:
        return dequantize_expanded(raw.cpu(), ggml_type, shape).to(device)
    return dequantize(raw.to(device), ggml_type, shape)


DECODE_CHUNK_ELEMENTS = 1 << 24  # dequantize at most this many values at a time (64 MiB of float32)


def decode_to(raw: torch.Tensor, ggml_type: GGMLQuantizationType, shape: tuple[int, ...], device: torch.device,
              dtype: torch.dtype) -> torch.Tensor:
    """The tensor on ``device`` in ``dtype``, block-quantized types dequantized a bounded slab of
    rows at a time, so the only full-size allocation is the result (no float32 copy of it)."""
    if ggml_type in DENSE_TYPES or len(shape) < 2:
        return decode_dense(raw, ggml_type, shape, device).to(dtype)
    rows = shape[0]
    row_elements = 1
    for d in shape[1:]:
        row_elements *= d
    row_bytes = raw.numel() // rows
    out = torch.empty(shape, dtype=dtype, device=device)
    step = max(1, DECODE_CHUNK_ELEMENTS // row_elements)
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        part = raw[lo * row_bytes : hi * row_bytes]
        if ggml_type in EXPANDED:
            out[lo:hi] = dequantize_expanded(part.cpu(), ggml_type, (hi - lo, *shape[1:])).to(device, dtype)
        else:
            out[lo:hi] = dequantize(part.to(device), ggml_type, (hi - lo, *shape[1:])).to(dtype)
    return out
