"""Executor: the one contract the engine steps a model through, wherever its stages run.

:class:`~stagewise.runtime.pipeline.Pipeline` (stages in this process) and
:class:`~stagewise.runtime.remote_pipeline.DistributedPipeline` (stages in worker processes)
implement it; neither derives from the other. ``submit`` launches a step and returns a
:class:`~stagewise.runtime.pipeline.StepHandle` whose ``result()`` publishes it or raises its typed
error (rolled back): the batcher reads every executor's steps the same way (one schedule).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from stagewise.models.stage_model import StageOutput
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.pipeline import CancelCheck, FaultHook, StepHandle, StepTimings
from stagewise.runtime.stage import Stage
from stagewise.runtime.worker_tokens import WorkerTokens
from stagewise.spec.kv_pool import KVPool


class Executor(Protocol):
    """Steps over ``rows`` sequence slots held by every stage, over one KV pool.

    ``stages``: one per planned stage (in a worker's case the coordinator's meta-device view: spec,
    config, ledger, no memory). ``device_tokens``: :meth:`step` takes token ids on a device (the
    generator's lookahead through :meth:`greedy_token`). ``fault_hook``: called with (stage index,
    step id) before each stage (tests and the engine's injected faults). ``timing``: measure
    ``last_timings`` per stage and boundary."""

    stages: list[Stage]
    device_tokens: bool
    supports_rows: bool
    fault_hook: FaultHook | None
    timing: bool
    last_timings: StepTimings

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: CancelCheck | None = None, first_row: int = 0,
             eager: bool = False, layout: StepLayout | None = None) -> StageOutput:
        """Run one step and wait for it: published, or rolled back with its typed error raised."""
        ...

    def submit(self, tokens: torch.Tensor | WorkerTokens, positions: torch.Tensor, start: int | None = None,
               all_logits: bool = False, first_row: int = 0, eager: bool = False,
               greedy: bool = False, layout: StepLayout | None = None) -> StepHandle:
        """Launch one step over rows ``first_row ..`` (tokens and positions ``(B, T)``, or a packed
        ``layout``'s ``(N, 1)``; or an earlier greedy step's handle's ``tokens``, a token a row);
        ``greedy``: the caller needs each row's greedy pair only."""
        ...

    def greedy_token(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy pair and next input of one row's ``logits`` ``(V,)`` (only where ``device_tokens``)."""
        ...

    def rollback(self) -> None:
        """Roll back every step not yet settled."""
        ...

    def reset(self, slot: int) -> None:
        """Start a new sequence in ``slot`` on every stage."""
        ...

    def set_blocks(self, row: int, block_ids: Sequence[int]) -> None:
        """Row ``row``'s KV lives in ``block_ids`` (position order) on every stage."""
        ...

    def move(self, src: int, dst: int) -> None:
        """Move row ``src``'s state (KV blocks, recurrent entries) to row ``dst`` on every stage, copying nothing."""
        ...

    def restore(self, row: int, entry: int) -> None:
        """Row ``row``'s next step reads recurrent-state entry ``entry`` (a prefix snapshot) on every stage."""
        ...

    @property
    def kv_pool(self) -> KVPool | None: ...

    @property
    def snapshot_entries(self) -> range:
        """The recurrent-state entries every stage keeps for prefix snapshots (empty: none, or no
        recurrent state)."""
        ...

    @property
    def step_graphs(self) -> bool: ...

    @property
    def max_in_flight(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def degraded(self) -> bool: ...

    def health(self) -> dict[str, Any]:
        """``status`` (ok | degraded | failed | closed), ``degraded``, ``message``, ``workers``."""
        ...

    def close(self) -> None: ...
