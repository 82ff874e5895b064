"""InFlight: a step the batcher launched whose tokens it has not collected yet: the executor's handle
until it is read, then the step's logits or the host copy of its greedy pairs (token and
log-probability per row)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError
from stagewise.runtime.greedy_pairs import read_greedy_pairs
from stagewise.runtime.pipeline import StepHandle
from stagewise.runtime.worker_tokens import WorkerTokens


@dataclass(eq=False)
class InFlight:
    """A launched step whose tokens have not been collected: a decode group's step or a packed step
    (decoding rows and prompts' chunks, or prompts' chunks alone). ``handle`` is the executor's until :meth:`settle` reads it."""

    rows: tuple[Sequence | None, ...]  # per row of the step (None: padding)
    handle: StepHandle | None  # the step, published (or rolled back) when read
    group: int = -1  # decode group index; -1 for a packed step without decoding rows
    snapshots: tuple[tuple[int, bytes], ...] = ()  # prefix snapshots it writes: (entry, key), keyed once published
    tokens: torch.Tensor | WorkerTokens | None = None  # (P, 1) the greedy tokens on the exit device (every row greedy, CUDA), or a worker's
    logits: torch.Tensor | None = None  # (P, 1, V) on the exit device, once settled
    pairs: torch.Tensor | None = None  # (P, 2) greedy token and log-probability, host (pinned) once ready
    ready: object = None  # CUDA event the host copy of ``pairs`` completes at

    def settle(self) -> StagewiseError | None:
        """Read the step's output (publishing it); returns its typed error when it failed."""
        assert self.handle is not None
        try:
            out = self.handle.result()
        except StagewiseError as exc:
            return exc
        ready, self.handle = self.handle.ready, None
        if out.pairs is not None:  # the exit computed every row's greedy pair (all rows greedy)
            self.pairs, self.ready = out.pairs, ready
            return None
        self.logits = out.logits
        # the greedy rows' pairs where the logits are
        if self.logits is not None and any(s is not None and s.device_greedy for s in self.rows):
            _, self.pairs, self.ready = read_greedy_pairs(self.logits[:, -1])
        return None
