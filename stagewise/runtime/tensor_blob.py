"""TensorBlob: a tensor as a control-plane message carries it (the exit's logits and features inside
an :class:`~stagewise.runtime.worker_messages.Ack`): its raw bytes, shape and dtype, bit-exact.
Decoding checks the bytes against the shape and dtype."""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
import torch
from msgspec import Meta

DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "int64": torch.int64}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class TensorBlob(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tensor's raw bytes, shape and dtype (bit-exact; copied to the host)."""

    shape: Annotated[list[Annotated[int, Meta(ge=0, le=2**62)]], Meta(max_length=8)]
    dtype: Literal["float32", "bfloat16", "float16", "int64"]
    data: bytes

    def __post_init__(self) -> None:
        expected = math.prod(self.shape) * DTYPE_NAMES[self.dtype].itemsize
        if len(self.data) != expected:
            raise ValueError(f"{len(self.data)} bytes for shape {self.shape} {self.dtype} ({expected} expected)")

    @staticmethod
    def of(tensor: torch.Tensor) -> TensorBlob:
        t = tensor.detach().cpu().contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return TensorBlob(shape=list(t.shape), dtype=dtype_name(t.dtype), data=data)  # type: ignore[arg-type]

    def tensor(self) -> torch.Tensor:
        dtype = DTYPE_NAMES[self.dtype]
        if not self.data:
            return torch.empty(self.shape, dtype=dtype)
        return torch.frombuffer(bytearray(self.data), dtype=torch.uint8).view(dtype).reshape(self.shape)
