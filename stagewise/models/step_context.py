"""StepContext: what every block of a stage needs to know about the step being run."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepContext:
    """Positions and masks for one step over ``B`` sequences of ``T`` new tokens each.

    ``positions`` ``(B, T)`` are absolute; ``start`` is the common first position when every
    sequence's positions are ``start .. start+T-1``; ``kv_length`` is ``max(positions) + 1``;
    ``mask`` ``(B, 1, G·T, kv_length)`` is True where key position ``j <= `` query position: the
    causal mask repeated for the ``G`` query heads that share a KV head (grouped-query attention
    folds them into G·T query rows, group-major), built once per step for every attention block.
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
              rotary: dict[int, tuple[torch.Tensor, torch.Tensor]], query_groups: int = 1) -> StepContext:
        keys = torch.arange(kv_length, device=positions.device)
        mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L)
        if query_groups > 1:
            mask = mask.repeat(1, 1, query_groups, 1)  # (B, 1, G*T, L)
        return StepContext(positions, start, kv_length, mask, rotary)
