"""Segment: the one loop that runs a step through a contiguous range of stages.

The in-process :class:`~stagewise.runtime.pipeline.Pipeline` runs all its stages as one segment; a
worker (:class:`~stagewise.runtime.worker_segment.WorkerSegment`) runs the stages it owns as one,
between its two distributed ends. Either way: every stage's positions are put on its device first
(their copies never wait behind the previous stage), then each stage runs and hands its activation
to the next in process, into the next stage's graph input where that one replays a graph. State
stays provisional: publishing and rolling back are the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from stagewise.models.stage_model import StageOutput
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.channel import Channel
from stagewise.runtime.handoff import Handoff
from stagewise.runtime.stage import Stage

_SPIN_CYCLES = 2_000_000  # ~1 ms of GPU clock: longer than the host takes to enqueue a handoff (100 us was not, at times)
BeforeStage = Callable[[int], None]  # (index of the stage in the segment) -> may raise


@dataclass(frozen=True)
class SegmentStep:
    """One step as every stage of a segment runs it: ``positions`` ``(B, T)`` on the host for state
    rows ``first_row ..``; ``start``: the common first position (None: per row); ``eager``: replay
    (or capture) no CUDA graph; ``layout``: a packed step (eager)."""

    step_id: int
    positions: torch.Tensor
    start: int | None = None
    all_logits: bool = False
    first_row: int = 0
    eager: bool = False
    layout: StepLayout | None = None

    @property
    def kv_end(self) -> int:
        """The largest position + 1 (a graph replays up to it)."""
        return int(self.positions.max()) + 1


@dataclass
class SegmentTimings:
    """Seconds per stage and per in-process boundary of one segment run (see ``Pipeline.StepTimings``)."""

    stage_s: list[float]
    handoff_s: list[float]
    handoff_device_s: list[float]


class Segment:
    """Stages ``stages`` (consecutive, in order) joined by ``channels`` (one per boundary); activations
    of ``hidden_size``. :meth:`run`'s ``timing``: synchronize each device after its work so the host
    clock times it, and time GPU-to-GPU copies with CUDA events."""

    def __init__(self, stages: list[Stage], channels: list[Channel], hidden_size: int, pin: bool = False) -> None:
        if len(channels) != max(0, len(stages) - 1):
            raise ValueError("a segment needs one channel per stage boundary")
        self.stages = stages
        self.channels = channels
        self.hidden_size = hidden_size
        self.pin = pin  # stage the positions in pinned memory (a stage on CUDA)

    def shapes(self, input_shape: tuple[int, ...], step: SegmentStep) -> list[tuple[int, ...]]:
        """Each stage's input shape: ``input_shape`` first (token ids, or the received activation)."""
        batch, steps = int(step.positions.shape[0]), int(step.positions.shape[1])
        return [input_shape] + [(batch, steps, self.hidden_size)] * (len(self.stages) - 1)

    def graphed(self, step: SegmentStep) -> list[bool]:
        """Which stages replay a CUDA graph for ``step``."""
        steps = int(step.positions.shape[1])
        return [stage.graphed(steps, step.all_logits) and not step.eager and step.layout is None
                for stage in self.stages]

    def put_positions(self, step: SegmentStep, input_shape: tuple[int, ...]) -> list[torch.Tensor]:
        """Start every stage's copy of the positions (into its graph's buffer where it replays one)."""
        staged = step.positions.pin_memory() if self.pin else step.positions
        shapes, graphed = self.shapes(input_shape, step), self.graphed(step)
        return [stage.put_positions(staged, shapes[k], graphed[k], step.first_row)
                for k, stage in enumerate(self.stages)]

    def run(self, step: SegmentStep, x: torch.Tensor, positions: list[torch.Tensor],
            before_stage: BeforeStage | None = None, timing: bool = False) -> tuple[StageOutput, SegmentTimings]:
        """Run ``step`` from input ``x`` (token ids ``(B, T)`` or an activation ``(B, T, H)``) through
        every stage, ``positions`` from :meth:`put_positions`; ``before_stage(k)`` is called before
        stage ``k`` (faults, cancellation). Returns the last stage's output, provisional."""
        timings = SegmentTimings([], [], [])
        shapes, graphed = self.shapes(tuple(x.shape), step), self.graphed(step)
        out: StageOutput | None = None
        for k, stage in enumerate(self.stages):
            if before_stage is not None:
                before_stage(k)
            t0 = time.perf_counter()
            graph = graphed[k] or (step.layout is not None and not step.eager)  # a packed step's pieces
            out = stage.run(x, positions[k], step.start, step.all_logits, step.first_row, step.kv_end,
                            graph=graph, layout=step.layout)
            _sync(stage.device, timing)
            timings.stage_s.append(time.perf_counter() - t0)
            if k == len(self.stages) - 1:
                break
            nxt = self.stages[k + 1]
            into = nxt.input_slot(shapes[k + 1], step.first_row) if graphed[k + 1] else None  # its graph's input
            events = _copy_events(stage.device, nxt.device, timing)
            t0 = time.perf_counter()
            if events is not None:
                # NOTE: keep the sending stream busy while the host enqueues the copy, so the events
                # time the copy itself, not the host's latency (with graphs the host runs ahead)
                stream = torch.cuda.current_stream(stage.device)
                events[0].record(stream)
                with torch.cuda.device(stage.device):
                    torch.cuda._sleep(_SPIN_CYCLES)
                events[1].record(stream)
            received = self.channels[k].send(Handoff(step.step_id, step.positions, out.hidden), into)
            if events is not None:
                events[2].record(torch.cuda.current_stream(stage.device))
            received.check(step.step_id, step.positions, self.hidden_size, nxt.dtype)
            _sync(nxt.device, timing)
            host_s = time.perf_counter() - t0
            if events is not None:
                events[2].synchronize()
                timings.handoff_device_s.append(events[1].elapsed_time(events[2]) * 1e-3)
                host_s -= events[0].elapsed_time(events[1]) * 1e-3  # the spin is not the handoff's
            timings.handoff_s.append(host_s)
            x = received.hidden
        assert out is not None
        return out, timings


def _sync(device: torch.device, timing: bool) -> None:
    if timing and device.type == "cuda":
        torch.cuda.synchronize(device)


def _copy_events(src: torch.device, dst: torch.device, timing: bool) -> tuple[Any, Any, Any] | None:
    """Spin-start, copy-start and copy-end events around a GPU-to-GPU handoff, when timing."""
    if not (timing and src.type == "cuda" and dst.type == "cuda"):
        return None
    with torch.cuda.device(src):
        return tuple(torch.cuda.Event(enable_timing=True) for _ in range(3))  # type: ignore[return-value]
