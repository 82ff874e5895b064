"""StepGraphs: one stage's decode steps captured as CUDA graphs.

A decode step (one token per sequence) launches hundreds of small kernels; replaying a captured
graph removes the host's launch cost and any synchronization inside the step. Graphs are keyed by
(first state row, batch, tokens per sequence, attended length) (:func:`graph_length`): decode
attention's Triton kernel reads each row's length from the positions on the device and cuts its keys
by that length alone (:mod:`~stagewise.kernels.decode_attention_triton`), so its graphs are captured
once at the whole context and serve every length: one graph per (first row, batch, steps). The
reference path (``STAGEWISE_KERNELS=torch``) masks an attended extent instead, rounded up to a bucket
(:func:`kv_bucket`; the causal mask hides the unused positions): a graph per bucket. Recurrent state
is read and written through the stage's state-slot table and KV through its block table, both at fixed
addresses and updated in place between steps, so a replay reads them as they are then (no recapture,
no host sync). Every graph of one (first row, shape) reads the same static input and positions
buffers, so a step's inputs can be written into them directly (the positions from pinned host memory
ahead of time, the previous stage's activation by its channel, the sampled token by the sampler) with
no copy inside the step. Steps that carry prompts (packed steps) replay graph pieces between their
mixers instead (:mod:`~stagewise.runtime.packed_graphs`). Single-device and staged
pipelines capture the same graphs for the same shapes, so their results stay bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.kernels.triton_launch import triton_selected
from stagewise.models.stage_model import StageModel, StageOutput
from stagewise.models.stage_states import StageStates

MIN_BUCKET = 256


LINEAR_BUCKET = 1024


def kv_bucket(next_length: int, max_context: int) -> int:
    """Attended length for a step ending at ``next_length``: the smallest power of two >= ``next_length`` up to
    LINEAR_BUCKET (at least MIN_BUCKET), then the next multiple of LINEAR_BUCKET; capped at
    ``max_context``. Fewer wasted positions than pure powers of two, few graphs."""
    bucket = MIN_BUCKET
    while bucket < next_length and bucket < LINEAR_BUCKET:
        bucket *= 2
    if bucket < next_length:
        bucket = -(-next_length // LINEAR_BUCKET) * LINEAR_BUCKET
    return min(bucket, max_context)


def kv_buckets(limit: int, max_context: int) -> tuple[int, ...]:
    """Every bucket :func:`kv_bucket` gives a step ending at ``1 .. limit`` (ascending): the graphs one
    decode shape needs to cover sequences of up to ``limit`` positions."""
    buckets = [kv_bucket(1, max_context)]
    while buckets[-1] < min(limit, max_context):
        buckets.append(kv_bucket(buckets[-1] + 1, max_context))
    return tuple(buckets)


def length_free() -> bool:
    """Whether a decode graph serves every attended length: a CUDA stage's decode attention is then the
    Triton kernel (``STAGEWISE_KERNELS`` not ``torch``), which reads each row's length from the
    positions on the device; the reference path masks an extent fixed at capture."""
    return triton_selected()


def graph_length(kv_end: int, max_context: int) -> int:
    """The attended length a decode step ending at ``kv_end`` replays the graph of: ``max_context`` for
    every step where :func:`length_free` (one graph serves them all), else :func:`kv_bucket`."""
    return max_context if length_free() else kv_bucket(kv_end, max_context)


def graph_lengths(limit: int, max_context: int) -> tuple[int, ...]:
    """Every :func:`graph_length` of a step ending at ``1 .. limit`` (ascending): the graphs one decode
    shape needs to cover sequences of up to ``limit`` positions; one where :func:`length_free`."""
    return (max_context,) if length_free() else kv_buckets(limit, max_context)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    output: StageOutput


@dataclass
class _Slots:
    """The static buffers every graph of one (batch, tokens per sequence) shape reads."""

    inputs: torch.Tensor
    positions: torch.Tensor


class StepGraphs:
    """Lazily captured step graphs for one stage on one CUDA device."""

    def __init__(self, model: StageModel, states: StageStates, device: torch.device,
                 max_context: int, input_dtype: torch.dtype) -> None:
        self.input_dtype = input_dtype  # token ids (entry) or the activation's dtype
        self.model = model
        self.states = states
        self.device = device
        self.max_context = max_context
        self.graphs: dict[tuple[int, int, int, int], _Graph] = {}
        self.slots: dict[tuple[int, tuple[int, ...]], _Slots] = {}  # by first row and the input's shape
        self.pool = torch.cuda.graph_pool_handle()
        # NOTE: torch.cuda.graph's default capture stream belongs to whichever device was current
        # when it was first made; each stage captures on a stream of its own device.
        self.stream = torch.cuda.Stream(device)
        # the split-K counters of the graphs captured on this stream (packed pieces too), made and zeroed
        # now: one first made inside a capture holds garbage until that graph's first replay
        from stagewise.kernels.moe_decode_triton import reserve_tile_counters

        with torch.cuda.stream(self.stream):
            reserve_tile_counters(device)
        torch.cuda.current_stream(device).wait_stream(self.stream)

    def covers(self, steps: int) -> bool:
        """Whether a step of ``steps`` tokens per sequence replays a graph."""
        return steps == 1

    def slots_for(self, shape: tuple[int, ...], first_row: int = 0) -> _Slots:
        """The static input (``shape``: token ids ``(B, T)`` or an activation ``(B, T, H)``) and positions
        ``(B, T)`` buffers that every replay of this shape at ``first_row`` reads; made once, on first use."""
        slots = self.slots.get((first_row, shape))
        if slots is None:
            slots = _Slots(torch.zeros(shape, dtype=self.input_dtype, device=self.device),
                           torch.zeros(shape[:2], dtype=torch.long, device=self.device))
            self.slots[(first_row, shape)] = slots
        return slots

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, kv_end: int, first_row: int = 0) -> StageOutput:
        """Replay (capturing on first use) the step for ``inputs`` at ``positions`` ``(B, T)`` of state rows
        ``first_row ..``, the largest position being ``kv_end - 1`` (only each row's last position's
        logits). Inputs or positions already written into :meth:`slots_for`'s buffers are not copied again."""
        batch, steps = int(positions.shape[0]), int(positions.shape[1])
        length = graph_length(kv_end, self.max_context)
        rows = slice(first_row, first_row + batch)
        key = (first_row, batch, steps, length)
        with torch.cuda.device(self.device):  # capture and replay on this stage's own device
            slots = self.slots_for(tuple(inputs.shape), first_row)
            if positions is not slots.positions:
                slots.positions.copy_(positions, non_blocking=True)
            if inputs is not slots.inputs:
                slots.inputs.copy_(inputs, non_blocking=True)
            entry = self.graphs.get(key)
            if entry is None:
                entry = self._capture(slots, length, first_row)
                self.graphs[key] = entry
            entry.graph.replay()
        self.states.begin(range(rows.start, rows.stop))  # no Python of the model ran to begin the step
        return entry.output

    def _capture(self, slots: _Slots, length: int, first_row: int) -> _Graph:
        side = self.stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            # NOTE: warm-up writes provisional state with this very step's inputs; the replay that
            # follows writes the same values, so nothing published changes.
            for _ in range(2):
                self.model(slots.inputs, slots.positions, self.states, start=None, kv_length=length,
                           first_row=first_row)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the server's other threads may touch CUDA (metrics) while this one captures
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"), \
                torch.inference_mode():
            output = self.model(slots.inputs, slots.positions, self.states, start=None, kv_length=length,
                                first_row=first_row)
        return _Graph(graph, output)
