"""greedy_pairs: each row's greedy token and its log-probability, computed where the logits are.

The batcher computes them on the exit device for rows that sample greedily, and so does the exit
worker of a distributed pipeline (which then sends two numbers a row instead of the logits): one
function, so both give the same bits.
"""

from __future__ import annotations

import torch

from stagewise.kernels.triton_launch import use_triton


def greedy_pairs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``logits`` ``(P, V)``: the greedy tokens ``(P, 1)`` (the first maximum, as ``torch.argmax``) and
    ``(P, 2)`` float32 pairs ``(token, log-probability)``, both on the logits' device. On the Triton path
    two launches (:func:`~stagewise.kernels.greedy_sample_triton.greedy_sample_rows`), else torch's six."""
    if use_triton(logits) and logits.dim() == 2 and logits.shape[-1] < 1 << 24:
        from stagewise.kernels.greedy_sample_triton import greedy_sample_rows

        return greedy_sample_rows(logits)
    values, tokens = torch.max(logits, dim=-1)  # (P,)
    logprobs = values - torch.logsumexp(logits, dim=-1)
    pairs = torch.stack([tokens.to(torch.float32), logprobs.to(torch.float32)], dim=-1)  # (P, 2)
    return tokens[:, None], pairs
