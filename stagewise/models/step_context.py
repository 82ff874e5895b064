"""StepContext: what every block of a stage needs to know about the step being run."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepContext:
    """Positions and masks for one step over ``B`` sequences of ``T`` new tokens each.

    ``positions`` ``(B, T)`` are absolute; ``start`` is the common first position when every
    sequence's positions are ``start .. start+T-1``; ``kv_length`` is ``max(positions) + 1``;
    ``mask`` ``(B, 1, T, kv_length)`` is True where key position ``j <= `` query position.
    ``rotary`` maps a rotary width to its ``(cos, sin)`` pair, each ``(B, T, width)``.
    """

    positions: torch.Tensor
    start: int | None
    kv_length: int
    mask: torch.Tensor
    rotary: dict[int, tuple[torch.Tensor, torch.Tensor]]

    @property
    def batch(self) -> int:
        return int(self.positions.shape[0])

    @property
    def steps(self) -> int:
        return int(self.positions.shape[1])

    @staticmethod
    def build(positions: torch.Tensor, start: int | None, kv_length: int,
              rotary: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> StepContext:
        keys = torch.arange(kv_length, device=positions.device)
        mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L)
        return StepContext(positions, start, kv_length, mask, rotary)
