"""Handoff: the hidden activation crossing a stage boundary, with the metadata the receiver checks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.errors import HandoffError


@dataclass(frozen=True)
class Handoff:
    """One step's activation ``(B, T, H)`` on a device, with its step id and absolute positions
    ``(B, T)`` as host-side metadata (checking them never waits for a device)."""

    step_id: int
    positions: torch.Tensor
    hidden: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.hidden.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.hidden.dtype

    def check(self, step_id: int, positions: torch.Tensor, hidden_size: int, dtype: torch.dtype) -> None:
        """Raise :class:`HandoffError` unless this handoff is the one the receiver expects."""
        if self.step_id != step_id:
            raise HandoffError(f"handoff for step {self.step_id} arrived during step {step_id}")
        batch, steps = positions.shape
        if self.shape != (batch, steps, hidden_size):
            raise HandoffError(f"handoff shape {list(self.shape)} != expected {[batch, steps, hidden_size]}")
        if self.dtype != dtype:
            raise HandoffError(f"handoff dtype {self.dtype} != expected {dtype}")
        if not torch.equal(self.positions, positions):
            raise HandoffError(f"handoff positions differ from step {step_id}'s positions")
