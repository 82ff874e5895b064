"""Sample: one drawn token, its log-probability and the top alternatives (what a token event carries)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """A chosen token, its log-probability under the model, and the top alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
