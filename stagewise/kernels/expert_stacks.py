"""What the MoE kernels read of an expert stack ``(E, out, in)``: dense, Q8_0 or packed GGUF blocks.

The kernels take protocols, not the weight classes of :mod:`stagewise.weights.quant`, so they do not
import the weights package: :class:`~stagewise.weights.quant.q8_0.Q8_0Weight` satisfies
:class:`Q8_0Stack`, :class:`~stagewise.weights.quant.packed_weight.PackedWeight` :class:`PackedStack`;
the named tuples are the same as bare tensors (a 2-D matrix as a one-expert stack, ``w[None]``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import torch
from gguf.constants import GGMLQuantizationType


@runtime_checkable
class Q8_0Stack(Protocol):
    """A Q8_0 stack: int8 ``qs`` ``(E, out, in)`` and f16 ``scales`` ``(E, out, in / 32)``."""

    @property
    def qs(self) -> torch.Tensor: ...

    @property
    def scales(self) -> torch.Tensor: ...


class Q8_0Tensors(NamedTuple):
    """A Q8_0 stack as bare tensors."""

    qs: torch.Tensor
    scales: torch.Tensor


@runtime_checkable
class PackedStack(Protocol):
    """Any other packed stack: the GGUF rows ``raw`` uint8 ``(E, out, row_bytes)`` of ``in_features``
    values of ``ggml_type``."""

    @property
    def raw(self) -> torch.Tensor: ...

    @property
    def ggml_type(self) -> GGMLQuantizationType: ...

    @property
    def in_features(self) -> int: ...


class PackedTensors(NamedTuple):
    """A packed stack as bare values."""

    raw: torch.Tensor
    ggml_type: GGMLQuantizationType
    in_features: int


ExpertWeight = torch.Tensor | Q8_0Stack | PackedStack  # (E, out, in) dense, the Q8_0 stack, or packed blocks


def as_packed(weight: ExpertWeight) -> PackedStack | None:
    """``weight`` when it is a packed stack (neither dense nor Q8_0), else None."""
    if isinstance(weight, torch.Tensor) or isinstance(weight, Q8_0Stack) or not isinstance(weight, PackedStack):
        return None
    return weight


def values_and_scales(weight: ExpertWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(values, scales)`` of a dense stack (no scales) or a Q8_0 stack; a packed stack is refused."""
    if isinstance(weight, torch.Tensor):
        return weight, None
    if isinstance(weight, Q8_0Stack):
        return weight.qs, weight.scales
    raise TypeError(f"expected a dense tensor or a Q8_0 stack, not {type(weight).__name__}")


def stack_shape(weight: ExpertWeight) -> tuple[int, int, int]:
    """``(E, out, in)`` of any stack."""
    packed = as_packed(weight)
    if packed is not None:
        e, n, _ = packed.raw.shape
        return e, n, packed.in_features
    values, _ = values_and_scales(weight)
    e, n, k = values.shape
    return e, n, k
