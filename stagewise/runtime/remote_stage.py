"""RemoteStage: the coordinator's view of a stage that runs in a worker process.

It is a :class:`Stage` whose model is built on the meta device (structure and config, no
weights, no memory), so code that reads ``stage.spec``, ``stage.model.config`` or
``stage.charge_check()`` works unchanged; the measured bytes are the ones its worker reported
after loading. Running, publishing and rolling back happen in the worker.
"""

from __future__ import annotations

import torch

from stagewise.models.registry import build_stage
from stagewise.runtime.ledger import MemoryLedger
from stagewise.runtime.stage import Stage, StageSpec
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

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, start: int | None, all_logits: bool) -> None:  # type: ignore[override]
        raise RuntimeError(f"stage {self.spec.index} runs in worker {self.rank}; step the pipeline instead")

    def publish(self) -> None:  # the worker publishes on the coordinator's command
        pass

    def rollback(self) -> None:
        pass

    def reset(self, slot: int) -> None:
        pass

    def close(self) -> None:
        pass
