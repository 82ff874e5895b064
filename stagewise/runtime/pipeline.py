"""Pipeline: runs one transactional step through every stage.

A step is published only when every stage completed: each stage writes its state provisionally;
on any failure (exception, injected fault, cancellation between stages) every stage rolls back,
the pipeline stays usable, and a retry gives exactly the results of a run that never failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from stagewise.errors import StagewiseError, StepCancelled, StepFailed
from stagewise.models.stage_model import StageOutput
from stagewise.runtime.channel import Channel
from stagewise.runtime.handoff import Handoff
from stagewise.runtime.stage import Stage

_SPIN_CYCLES = 2_000_000  # ~1 ms of GPU clock: longer than the host takes to enqueue a handoff (100 us was not, at times)
FaultHook = Callable[[int, int], None]  # (stage index, step id) -> may raise
CancelCheck = Callable[[], bool]


@dataclass
class StepTimings:
    """Times of the last step (with ``timing`` on), seconds: per stage compute (host clock, the stage's
    device synchronized), per boundary handoff as the host sees it (send, check, receiver synchronized;
    between two CUDA devices less the spin that precedes the copy) and, between two CUDA devices, as
    the copy's device time (CUDA events on the sending stream, where the peer copy runs)."""

    stage_s: list[float] = field(default_factory=list)
    handoff_s: list[float] = field(default_factory=list)
    handoff_device_s: list[float] = field(default_factory=list)


class Pipeline:
    """Ordered stages joined by one channel per boundary. One device is a one-stage pipeline."""

    device_tokens = True  # step() takes token ids that live on a device (no host round trip)

    def __init__(self, stages: list[Stage], channels: list[Channel], timing: bool = False) -> None:
        if len(channels) != len(stages) - 1:
            raise ValueError("a pipeline needs one channel per stage boundary")
        self.stages = stages
        self.channels = channels
        self.timing = timing
        self.step_id = 0
        self.fault_hook: FaultHook | None = None
        self.last_timings = StepTimings()
        self._pin = any(s.device.type == "cuda" for s in stages) and torch.cuda.is_available()

    @property
    def entry_device(self) -> torch.device:
        return self.stages[0].device

    @property
    def hidden_size(self) -> int:
        return self.stages[0].model.config.hidden_size

    def _sync(self, device: torch.device) -> None:
        if self.timing and device.type == "cuda":
            torch.cuda.synchronize(device)

    def _copy_events(self, src: torch.device, dst: torch.device) -> tuple[Any, Any, Any] | None:
        """Spin-start, copy-start and copy-end events around a GPU-to-GPU handoff, when timing."""
        if not (self.timing and src.type == "cuda" and dst.type == "cuda"):
            return None
        with torch.cuda.device(src):
            return tuple(torch.cuda.Event(enable_timing=True) for _ in range(3))  # type: ignore[return-value]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: CancelCheck | None = None) -> StageOutput:
        """Run tokens ``(B, T)`` at ``positions`` ``(B, T)`` through all stages, then publish.

        Raises :class:`StepCancelled` or :class:`StepFailed` after rolling every stage back.
        """
        self.step_id += 1
        step_id = self.step_id
        timings = StepTimings()
        positions = positions.cpu()
        staged_pos = positions.pin_memory() if self._pin else positions
        try:
            if tokens.device.type == "cpu":
                x = (tokens.pin_memory() if self._pin else tokens).to(self.entry_device, non_blocking=True)
            else:  # a token sampled on a device (the generator's lookahead): never through the host
                x = tokens.to(self.entry_device, non_blocking=True)
            out: StageOutput | None = None
            for k, stage in enumerate(self.stages):
                if self.fault_hook is not None:
                    self.fault_hook(k, step_id)
                if k == 0 and cancel is not None and cancel():  # also one-stage pipelines, every prefill chunk
                    raise StepCancelled(f"step {step_id} cancelled before it started")
                t0 = time.perf_counter()
                pos = staged_pos.to(stage.device, non_blocking=True)  # (B, T), no host wait when pinned
                out = stage.run(x, pos, start, all_logits)
                self._sync(stage.device)
                timings.stage_s.append(time.perf_counter() - t0)
                if k == len(self.stages) - 1:
                    break
                if cancel is not None and cancel():
                    raise StepCancelled(f"step {step_id} cancelled between stage {k} and stage {k + 1}")
                nxt = self.stages[k + 1]
                events = self._copy_events(stage.device, nxt.device)
                t0 = time.perf_counter()
                if events is not None:
                    # NOTE: keep the sending stream busy while the host enqueues the copy, so the events
                    # time the copy itself, not the host's latency (with graphs the host runs ahead)
                    stream = torch.cuda.current_stream(stage.device)
                    events[0].record(stream)
                    with torch.cuda.device(stage.device):
                        torch.cuda._sleep(_SPIN_CYCLES)
                    events[1].record(stream)
                received = self.channels[k].send(Handoff(step_id, positions, out.hidden))
                if events is not None:
                    events[2].record(torch.cuda.current_stream(stage.device))
                received.check(step_id, positions, self.hidden_size, nxt.dtype)
                self._sync(nxt.device)
                host_s = time.perf_counter() - t0
                if events is not None:
                    events[2].synchronize()
                    timings.handoff_device_s.append(events[1].elapsed_time(events[2]) * 1e-3)
                    host_s -= events[0].elapsed_time(events[1]) * 1e-3  # the spin is not the handoff's
                timings.handoff_s.append(host_s)
                x = received.hidden
        except StagewiseError:
            self.rollback()
            raise
        except Exception as exc:
            self.rollback()
            raise StepFailed(f"step {step_id} failed and was rolled back: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            self.rollback()
            raise
        for stage in self.stages:
            stage.publish()
        self.last_timings = timings
        assert out is not None
        return out

    def rollback(self) -> None:
        for stage in self.stages:
            stage.rollback()

    def reset(self, slot: int) -> None:
        """Start a new sequence in ``slot`` on every stage."""
        for stage in self.stages:
            stage.reset(slot)

    @property
    def degraded(self) -> bool:
        """True while the pipeline refuses requests (an in-process pipeline never does)."""
        return False

    def health(self) -> dict[str, Any]:
        """For /health and /metrics: ``status`` (ok | degraded | failed | closed), ``degraded``,
        ``message`` and per-worker entries (none in process); see :class:`DistributedPipeline`."""
        return {"status": "ok", "degraded": False, "message": "", "workers": []}

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
