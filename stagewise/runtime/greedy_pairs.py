"""greedy_pairs: each row's greedy token and its log-probability, computed where the logits are.

The batcher computes them on the exit device for rows that sample greedily, and so does the exit
worker of a distributed pipeline (which then sends two numbers a row instead of the logits): one
function, so both give the same bits.
"""

from __future__ import annotations

import torch


def greedy_pairs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``logits`` ``(P, V)``: the greedy tokens ``(P, 1)`` (the first maximum, as ``torch.argmax``) and
    ``(P, 2)`` float32 pairs ``(token, log-probability)``, both on the logits' device."""
    values, tokens = torch.max(logits, dim=-1)  # (P,)
    logprobs = values - torch.logsumexp(logits, dim=-1)
    pairs = torch.stack([tokens.to(torch.float32), logprobs.to(torch.float32)], dim=-1)  # (P, 2)
    return tokens[:, None], pairs
