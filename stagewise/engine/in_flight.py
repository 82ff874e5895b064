"""InFlight: a step the batcher launched whose tokens it has not collected yet, and the host copy of
its greedy pairs (token and log-probability per row) on a side stream, so the host reads them
without waiting for the devices' next work."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError
from stagewise.runtime.greedy_pairs import greedy_pairs
from stagewise.runtime.pipeline import StepHandle


@dataclass(eq=False)
class InFlight:
    """A launched step whose tokens have not been collected: a decode group or a prefill chunk."""

    rows: tuple[Sequence | None, ...]  # per row of the step (None: padding)
    logits: torch.Tensor | None  # (P, 1, V) on the exit device
    pairs: torch.Tensor | None  # (P, 2) greedy token and log-probability, host (pinned) once ready
    ready: object = None  # CUDA event the host copy of ``pairs`` completes at
    tokens: torch.Tensor | None = None  # (P, 1) the greedy tokens on the exit device (every row greedy)
    group: int = -1  # decode group index; -1 for a prefill chunk
    final: bool = True  # prefill: the prompt's last chunk (its logits give the first token)
    sample_rows: tuple[bool, ...] | None = None  # prefill: the rows whose first token this step samples
    handle: StepHandle | None = None  # a step whose output (and failure) comes when it is collected

    def settle(self) -> StagewiseError | None:
        """Read a deferred step's output (publishing it); returns its typed error when it failed."""
        assert self.handle is not None
        try:
            out = self.handle.result()
        except StagewiseError as exc:
            return exc
        self.handle = None
        if self.sample_rows is not None and not any(self.sample_rows):
            return None  # a prefill chunk with nothing to sample
        if out.pairs is not None:  # the exit computed every row's greedy pair (all rows greedy)
            self.pairs = out.pairs
            return None
        self.logits = out.logits
        assert self.logits is not None
        if self.group >= 0 and any(s is not None and s.device_greedy for s in self.rows):
            _, self.pairs, self.ready = read_greedy_pairs(self.logits[:, -1])
        return None


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
