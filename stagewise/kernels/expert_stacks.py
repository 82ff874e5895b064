"""What the MoE kernels read of an expert stack ``(E, out, in)``: dense, Q8_0 or packed GGUF blocks.

The kernels take protocols, not the weight classes of :mod:`stagewise.weights.quant`, so they do not
import the weights package: :class:`~stagewise.weights.quant.q8_0.Q8_0Weight` satisfies
:class:`Q8_0Stack`, :class:`~stagewise.weights.quant.packed_weight.PackedWeight` :class:`PackedStack`;
the named tuples are the same as bare tensors (a 2-D matrix as a one-expert stack, ``w[None]``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypeGuard, runtime_checkable

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.spec.packed_types import PLANES, block_elements, plane_row_bytes


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
    """Any other packed stack: rows of ``in_features`` values of ``ggml_type`` as three uint8 planes
    ``(E, out, plane bytes)`` (:class:`~stagewise.spec.packed_types.PlaneLayout`): the quants ``qs``, the
    high bits ``qh`` (last dim 0 where the type has none) and the scales/mins ``meta``."""

    @property
    def qs(self) -> torch.Tensor: ...

    @property
    def qh(self) -> torch.Tensor: ...

    @property
    def meta(self) -> torch.Tensor: ...

    @property
    def ggml_type(self) -> GGMLQuantizationType: ...

    @property
    def in_features(self) -> int: ...


class PackedTensors(NamedTuple):
    """A packed stack as bare values."""

    qs: torch.Tensor
    qh: torch.Tensor
    meta: torch.Tensor
    ggml_type: GGMLQuantizationType
    in_features: int


def check_planes(qs: torch.Tensor, qh: torch.Tensor, meta: torch.Tensor, ggml_type: GGMLQuantizationType,
                 in_features: int, dims: tuple[int, ...] = (2, 3)) -> None:
    """Raise ``ValueError`` unless the planes hold rows of ``in_features`` values of ``ggml_type``: uint8,
    ``dims`` dimensions, one lead shape, each plane's bytes contiguous."""
    if ggml_type not in PLANES:
        raise ValueError(f"{ggml_type.name} is not a packed block type")
    planes = (qs, qh, meta)
    if any(p.dtype != torch.uint8 or p.dim() not in dims or p.shape[:-1] != qs.shape[:-1] for p in planes):
        raise ValueError(f"packed planes must be uint8 of {' or '.join(map(str, dims))} dimensions and one lead shape")
    if any(p.shape[-1] > 1 and p.stride(-1) != 1 for p in planes):
        raise ValueError("each packed plane's bytes must be contiguous")
    want = plane_row_bytes(ggml_type, in_features)
    if in_features % block_elements(ggml_type) or tuple(p.shape[-1] for p in planes) != want:
        raise ValueError(f"{ggml_type.name}: planes of {[p.shape[-1] for p in planes]} bytes per row do not hold "
                         f"{in_features} values")


ExpertWeight = torch.Tensor | Q8_0Stack | PackedStack  # (E, out, in) dense, the Q8_0 stack, or packed blocks


_KINDS: dict[type, str] = {}


def _kind(weight: object) -> str:
    """``dense``, ``q8_0``, ``packed`` or ``other``: the protocols' answer for the first instance of
    ``weight``'s class, kept for the class.

    NOTE: an ``isinstance`` against a runtime-checkable protocol walks the protocol's members at every
    call (~10 us on Python 3.11) and the MoE and dense launchers ask at every launch; every instance of
    a weight class has the same members."""
    kind = _KINDS.get(type(weight))
    if kind is None:
        if isinstance(weight, torch.Tensor):
            kind = "dense"
        elif isinstance(weight, Q8_0Stack):
            kind = "q8_0"
        else:
            kind = "packed" if isinstance(weight, PackedStack) else "other"
        _KINDS[type(weight)] = kind
    return kind


def is_q8_0(weight: object) -> TypeGuard[Q8_0Stack]:
    """Whether ``weight`` is a :class:`Q8_0Stack` (``qs`` and ``scales``)."""
    return _kind(weight) == "q8_0"


def as_packed(weight: ExpertWeight) -> PackedStack | None:
    """``weight`` when it is a packed stack (neither dense nor Q8_0), else None."""
    return weight if _kind(weight) == "packed" else None  # type: ignore[return-value]


def values_and_scales(weight: ExpertWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(values, scales)`` of a dense stack (no scales) or a Q8_0 stack; a packed stack is refused."""
    kind = _kind(weight)
    if kind == "dense":
        return weight, None  # type: ignore[return-value]
    if kind == "q8_0":
        return weight.qs, weight.scales  # type: ignore[union-attr]
    raise TypeError(f"expected a dense tensor or a Q8_0 stack, not {type(weight).__name__}")


def stack_shape(weight: ExpertWeight) -> tuple[int, int, int]:
    """``(E, out, in)`` of any stack."""
    packed = as_packed(weight)
    if packed is not None:
        e, n, _ = packed.qs.shape
        return e, n, packed.in_features
    values, _ = values_and_scales(weight)
    e, n, k = values.shape
    return e, n, k
