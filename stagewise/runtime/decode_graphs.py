"""DecodeGraphs: one stage's decode step captured as CUDA graphs and replayed.

A decode step (one token per sequence) launches hundreds of small kernels; replaying a captured
graph removes the host's launch cost and any synchronization inside the step. Graphs are keyed
by (batch, attended-length bucket, recurrent buffer parity): the attended length is rounded up to
a power of two (the causal mask hides the unused positions), and double-buffered recurrent state
alternates between two buffer addresses. Single-device and staged pipelines capture the same
graphs for the same shapes, so their results stay bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.models.stage_model import StageModel, StageOutput
from stagewise.models.state import BlockState

MIN_BUCKET = 256


LINEAR_BUCKET = 1024


def kv_bucket(next_length: int, max_context: int) -> int:
    """Attended length for a decode step: the smallest power of two >= ``next_length`` up to
    LINEAR_BUCKET (at least MIN_BUCKET), then the next multiple of LINEAR_BUCKET; capped at
    ``max_context``. Fewer wasted positions than pure powers of two, few graphs."""
    bucket = MIN_BUCKET
    while bucket < next_length and bucket < LINEAR_BUCKET:
        bucket *= 2
    if bucket < next_length:
        bucket = -(-next_length // LINEAR_BUCKET) * LINEAR_BUCKET
    return min(bucket, max_context)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: torch.Tensor
    positions: torch.Tensor
    output: StageOutput


class DecodeGraphs:
    """Lazily captured decode graphs for one stage on one CUDA device."""

    def __init__(self, model: StageModel, states: dict[int, BlockState], device: torch.device,
                 max_context: int) -> None:
        self.model = model
        self.states = states
        self.device = device
        self.max_context = max_context
        self.graphs: dict[tuple[int, int, tuple[int, ...]], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        # NOTE: torch.cuda.graph's default capture stream belongs to whichever device was current
        # when it was first made; each stage captures on a stream of its own device.
        self.stream = torch.cuda.Stream(device)

    def _parity(self) -> tuple[int, ...]:
        return tuple(int(getattr(s, "active", 0)) for s in self.states.values())

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, start: int) -> StageOutput:
        """Replay (capturing on first use) the decode step for ``inputs`` at ``positions`` (B, 1)."""
        bucket = kv_bucket(start + 1, self.max_context)
        key = (int(positions.shape[0]), bucket, self._parity())
        with torch.cuda.device(self.device):  # capture and replay on this stage's own device
            entry = self.graphs.get(key)
            if entry is None:
                entry = self._capture(inputs, positions, bucket)
                self.graphs[key] = entry
            entry.inputs.copy_(inputs)
            entry.positions.copy_(positions)
            entry.graph.replay()
        for state in self.states.values():
            mark = getattr(state, "mark_written", None)
            if mark is not None:
                mark()
        return entry.output

    def _capture(self, inputs: torch.Tensor, positions: torch.Tensor, bucket: int) -> _Graph:
        static_in = inputs.clone()
        static_pos = positions.clone()
        side = self.stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            # NOTE: warm-up writes provisional state with this very step's inputs; the replay that
            # follows writes the same values, so nothing published changes.
            for _ in range(2):
                self.model(static_in, static_pos, self.states, start=None, kv_length=bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the server's other threads may touch CUDA (metrics) while this one captures
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"), \
                torch.inference_mode():
            output = self.model(static_in, static_pos, self.states, start=None, kv_length=bucket)
        return _Graph(graph, static_in, static_pos, output)
