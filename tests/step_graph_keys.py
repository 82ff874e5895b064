"""StepGraphKeys: a CPU stand-in for a stage's :class:`~stagewise.runtime.step_graphs.StepGraphs` that
records the graph keys a GPU stage would capture and runs each step eagerly as the captured graph would
(at its graph's attended length: :func:`~stagewise.runtime.step_graphs.graph_length`), so tests on the host see the GPU's decode shapes and kernel variants."""

from __future__ import annotations

import torch

from stagewise.models.stage_model import StageOutput
from stagewise.runtime.pipeline import Pipeline
from stagewise.runtime.stage import Stage
from stagewise.runtime.step_graphs import StepGraphs, graph_length


class StepGraphKeys:
    """Graph keys ``(first row, batch, steps, attended length)`` in the order they were first "captured"."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        self.captured: list[tuple[int, int, int, int]] = []
        self.slots: dict[tuple[int, tuple[int, ...]], object] = {}
        self.input_dtype = torch.long if stage.model.entry else stage.dtype
        self.device = stage.device

    slots_for = StepGraphs.slots_for  # the static buffers a graph reads, made as a GPU stage makes them

    def covers(self, steps: int) -> bool:
        return steps == 1

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, kv_end: int, first_row: int = 0) -> StageOutput:
        length = graph_length(kv_end, self.stage.max_context)
        key = (first_row, int(positions.shape[0]), int(positions.shape[1]), length)
        if key not in self.captured:
            self.captured.append(key)
        assert self.stage.states is not None
        with torch.inference_mode():
            return self.stage.model(inputs.to(self.stage.device), positions, self.stage.states, start=None,
                                    kv_length=length, first_row=first_row)


def record_graph_keys(pipeline: Pipeline) -> list[StepGraphKeys]:
    """Give every stage of ``pipeline`` a :class:`StepGraphKeys` (before a batcher is made over it: it
    then pads decode groups to graph buckets, as on a GPU); returns them, stage order."""
    keys = []
    for stage in pipeline.stages:
        stage.graphs = StepGraphKeys(stage)  # type: ignore[assignment]
        keys.append(stage.graphs)
    return keys  # type: ignore[return-value]
