"""StepContext: what every block of a stage needs to know about the step being run."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepContext:
    """Positions and masks for one step over ``B`` sequences of ``T`` new tokens each.

    ``positions`` ``(B, T)`` are absolute; ``start`` is the common first position when every
    sequence's positions are ``start .. start+T-1``; ``kv_length`` is ``max(positions) + 1``;
    ``mask`` ``(B, 1, G·T, kv_length)`` is True where key position ``j <= `` query position: the
    causal mask repeated for the ``G`` query heads that share a KV head (grouped-query attention
    folds them into G·T query rows, group-major), built on first use, once per step for every
    attention block (a GPU decode step's attention kernel reads the positions instead: no mask).
    ``rotary`` maps a rotary width to its ``(cos, sin)`` pair, each ``(B, T, width)``.
    """

    positions: torch.Tensor
    start: int | None
    kv_length: int
    rotary: dict[int, tuple[torch.Tensor, torch.Tensor]]
    query_groups: int = 1

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        keys = torch.arange(self.kv_length, device=self.positions.device)
        mask = (keys[None, None, :] <= self.positions[:, :, None])[:, None]  # (B, 1, T, L)
        if self.query_groups > 1:
            mask = mask.repeat(1, 1, self.query_groups, 1)  # (B, 1, G*T, L)
        return mask

    @property
    def batch(self) -> int:
        return int(self.positions.shape[0])

    @property
    def steps(self) -> int:
        return int(self.positions.shape[1])

    @staticmethod
    def build(positions: torch.Tensor, start: int | None, kv_length: int,
              rotary: dict[int, tuple[torch.Tensor, torch.Tensor]], query_groups: int = 1) -> StepContext:
        return StepContext(positions, start, kv_length, rotary, query_groups)
