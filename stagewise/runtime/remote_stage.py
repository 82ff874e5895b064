"""RemoteStage: the coordinator's view of a stage that runs in a worker process.

It is a :class:`Stage` whose model is built on the meta device (structure and config, no
weights, no memory), so code that reads ``stage.spec``, ``stage.model.config`` or
``stage.charge_check()`` works unchanged; the measured bytes are the ones its worker reported
after loading. Its state is described on the meta device too (:meth:`describe_state`: the shapes
and bytes of the worker's KV pools and recurrent rows, charged to its ledger), so the state
metrics read a worker's stage as they read a local one. Running, publishing and rolling back
happen in the worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from stagewise.models.registry import build_stage
from stagewise.runtime.ledger import MemoryLedger
from stagewise.runtime.peak_memory import PeakMemory
from stagewise.runtime.stage import ChargeCheck, Stage, StageSpec
from stagewise.spec.model_config import ModelConfig


class RemoteStage(Stage):
    """Stage ``spec`` executed by worker ``rank`` (its process, possibly on another host)."""

    def __init__(self, spec: StageSpec, config: ModelConfig, dtype: torch.dtype, rank: int) -> None:
        model = build_stage(config, spec.start, spec.end, spec.entry, spec.exit, device="meta")
        super().__init__(spec, model, MemoryLedger(spec.device, spec.budget_bytes), dtype)
        self.rank = rank
        self.reported_bytes = 0

    def measured_bytes(self) -> int:
        return self.reported_bytes

    def charge_check(self, peak: PeakMemory | None = None) -> ChargeCheck:
        """Planned parts beside the worker's reported total (weights + state); no parts or peak measured here."""
        del peak
        check = super().charge_check()
        return dataclasses.replace(check, measured_bytes=self.reported_bytes, measured_weights_bytes=0,
                                   measured_state_bytes=0)

    def describe_state(self, batch: int, max_context: int, kv_blocks: int | None = None, snapshots: int = 0) -> None:
        """The worker's state as :meth:`Stage.allocate_state` makes it, on the meta device (no memory):
        ``batch`` rows of ``max_context`` positions over ``kv_blocks`` KV blocks; charged to the ledger."""
        self.block_table, self.states = self._charge_state(batch, max_context, kv_blocks, snapshots)

    def allocate_state(self, batch: int, max_context: int, kv_blocks: int | None = None, snapshots: int = 0) -> None:
        raise RuntimeError(f"stage {self.spec.index}'s state lives in worker {self.rank}; describe_state() describes it")

    def enable_graphs(self, packed_tokens: int = 0) -> bool:
        """False: the worker captures its own graphs (``Assignment.cuda_graphs``, ``packed_tokens``)."""
        return False

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, start: int | None, all_logits: bool) -> None:  # type: ignore[override]
        raise RuntimeError(f"stage {self.spec.index} runs in worker {self.rank}; step the pipeline instead")

    def publish(self, rows: Iterable[int] | None = None) -> None:  # the worker publishes on the coordinator's command
        pass

    def rollback(self, rows: Iterable[int] | None = None) -> None:
        pass

    def reset(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass
