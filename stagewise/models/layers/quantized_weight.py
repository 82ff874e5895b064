"""QuantizedWeight: the protocol of a weight resident in a packed (quantized) format.

Implementations live in :mod:`stagewise.weights.quant`: Q8_0 (int8 values + per-32-block f16
scales) and every other GGUF block type as the file's own blocks (``PackedWeight``). A :class:`~stagewise.models.layers.linear.Linear` holding one calls ``matmul``.
"""

from __future__ import annotations

from typing import Protocol

import torch


class QuantizedWeight(Protocol):
    """A resident quantized matrix of logical shape ``(out_features, in_features)``."""

    format_name: str

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def nbytes(self) -> int:
        """Resident bytes on the device (all packed buffers together)."""
        ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x`` of shape ``(..., in_features)``, in ``x``'s dtype."""
        ...

    def matmul_glu(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a fused gate/up weight (gate rows then up rows): ``silu(x @ G.T) * (x @ U.T)`` in one launch,
        bit for bit what ``silu_mul(matmul(x))`` gives; None where this format has no such launch for
        ``x``'s rows (the caller then runs the two)."""
        ...

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The dense ``(out, in)`` matrix (for tests and references; never kept resident)."""
        ...

    def fused_with(self, others: list[object]) -> QuantizedWeight | None:
        """A weight whose rows are this one's followed by ``others``' (one matmul for q/k/v or
        gate/up), or None when the others are of another kind or type."""
        ...

    def to(self, device: torch.device) -> QuantizedWeight: ...
