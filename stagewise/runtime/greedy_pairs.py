"""greedy_pairs: each row's greedy token and its log-probability, computed where the logits are.

The exit stage computes them for a step asked for greedy rows (in process, and in the exit worker of
a distributed pipeline, which then sends two numbers a row instead of the logits), the batcher for
the greedy rows of a step with logits, and the sampler for a lone greedy row: one function, so all
give the same bits.
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


_read_streams: dict[torch.device, torch.cuda.Stream] = {}


def read_greedy_pairs(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Greedy token and its log-probability for every row of ``logits`` ``(P, V)`` on their device; the
    ``(P, 2)`` result is copied to the host on a side stream. Returns the tokens ``(P, 1)`` on the
    device, the host tensor and the event its copy completes at (None: already on the host)."""
    device_tokens, pairs = greedy_pairs(logits)  # (P, 1), (P, 2)
    if pairs.device.type != "cuda":
        return device_tokens, pairs, None
    host = torch.empty(pairs.shape, dtype=pairs.dtype, pin_memory=True)
    side = _read_streams.get(pairs.device)
    if side is None:
        side = _read_streams[pairs.device] = torch.cuda.Stream(pairs.device)
    side.wait_stream(torch.cuda.current_stream(pairs.device))
    pairs.record_stream(side)
    with torch.cuda.device(pairs.device), torch.cuda.stream(side):
        host.copy_(pairs, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    return device_tokens, host, ready
