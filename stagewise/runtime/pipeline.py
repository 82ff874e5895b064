"""Pipeline: runs one transactional step through every stage.

A step is published only when every stage completed: each stage writes its state provisionally;
on any failure (exception, injected fault, cancellation between stages) every stage rolls back,
the pipeline stays usable, and a retry gives exactly the results of a run that never failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from stagewise.errors import StagewiseError, StepCancelled, StepFailed
from stagewise.models.stage_model import StageOutput
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.channel import Channel
from stagewise.runtime.greedy_pairs import read_greedy_pairs
from stagewise.runtime.segment import Segment, SegmentStep
from stagewise.runtime.stage import Stage
from stagewise.runtime.worker_tokens import WorkerTokens
from stagewise.spec.kv_pool import KVPool

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


class StepHandle:
    """A launched step: :meth:`result` gives its output once every stage completed and it is published,
    or raises the step's typed error (it was rolled back). Every pipeline's caller reads it the same
    way (one batcher schedule); an in-process pipeline's step is settled when launched (its GPU work
    runs on in stream order), one whose stages run in worker processes when its result is asked for
    (:class:`~stagewise.runtime.remote_pipeline.DistributedPipeline`).

    ``tokens`` ``(B, 1)``: a greedy step's tokens on the exit's CUDA device, readable at once (the next
    step may take them before the host reads the pairs), or the record of those a worker keeps
    (:class:`WorkerTokens`); ``ready``: the event the host copy of the output's ``pairs`` completes at
    (None: already on the host)."""

    def __init__(self, output: StageOutput | None = None, tokens: torch.Tensor | WorkerTokens | None = None,
                 ready: object = None) -> None:
        self.output = output
        self.error: StagewiseError | None = None
        self.tokens = tokens
        self.ready = ready

    def result(self) -> StageOutput:
        if self.error is not None:
            raise self.error
        assert self.output is not None
        return self.output


class Pipeline:
    """Ordered stages joined by one channel per boundary. One device is a one-stage pipeline."""

    device_tokens = True  # step() takes token ids that live on a device (no host round trip)
    supports_rows = True  # step() runs any rows; move() rearranges them (continuous batching)

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
        self.segment = Segment(stages, channels, stages[0].model.config.hidden_size, self._pin)  # every stage
        # a greedy step's handle gives its tokens on the exit's device, so the next step is launched before the
        # host reads this one's (the batcher's run-ahead): where the exit is a CUDA device (a CPU step is done
        # when launched: nothing to overlap); tests on the CPU set it to take the GPU's schedule
        self.run_ahead = stages[-1].device.type == "cuda"
        self._token_ready: Any = None  # event: a sampled token written into the entry's input from another GPU
        self._token_peer = False  # whether the exit GPU's sampler may write the entry GPU's memory
        entry, exit_ = stages[0].device, stages[-1].device
        if entry != exit_ and entry.type == exit_.type == "cuda":
            from stagewise.kernels.peer_copy_triton import enable_peer_access

            self._token_peer = enable_peer_access(exit_, entry)

    @property
    def entry_device(self) -> torch.device:
        return self.stages[0].device

    @property
    def hidden_size(self) -> int:
        return self.stages[0].model.config.hidden_size

    def greedy_token(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy-sample ``logits`` ``(V,)`` (the exit stage's last row) on its device, for the next
        one-token step. Returns ``(pair, tokens)``: ``(token, log-probability)`` float32 on the exit
        device, for the host to read, and the token ids ``(1, 1)`` to pass to :meth:`step`. When the next
        step replays a graph, the sampling kernel writes the token straight into the entry stage's
        graph input (from another GPU too, where peer access allows): the step then copies nothing."""
        from stagewise.kernels.greedy_sample_triton import greedy_sample

        entry = self.stages[0]
        source = logits.device
        if not entry.graphed(1, False) or (entry.device != source and not self._token_peer):
            pair = greedy_sample(logits)
            return pair, pair[:1].to(torch.long).view(1, 1)
        slot = entry.input_slot((1, 1))
        if entry.device == source:
            return greedy_sample(logits, token_out=slot), slot  # stream order keeps the slot's reads and writes apart
        sampler, reader = torch.cuda.current_stream(source), torch.cuda.current_stream(entry.device)
        sampler.wait_stream(reader)  # the entry's last replay has read the slot
        pair = greedy_sample(logits, token_out=slot)
        with torch.cuda.device(source):
            self._token_ready = torch.cuda.Event()
            self._token_ready.record(sampler)  # the next step's entry waits on it (after its positions' copy)
        return pair, slot

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: CancelCheck | None = None, first_row: int = 0,
             eager: bool = False, layout: StepLayout | None = None) -> StageOutput:
        """Run tokens ``(B, T)`` at ``positions`` ``(B, T)`` through all stages, then publish. The ``B``
        sequences are state rows ``first_row .. first_row + B - 1`` (sequence slots) on every stage.
        ``eager``: never replay (or capture) a CUDA graph for this step (shapes not worth a graph).
        ``layout``: a packed step (:class:`StepLayout`): ``(N, 1)``
        tokens and positions, each of the row the layout names (a CUDA stage replays its graph pieces,
        :class:`~stagewise.runtime.packed_graphs.PackedGraphs`, unless ``eager``); the output's logits are
        the layout's ``logits`` segments' ``(S, 1, V)``.

        Raises :class:`StepCancelled` or :class:`StepFailed` after rolling every stage back.
        """
        self.step_id += 1
        step_id = self.step_id
        step = SegmentStep(step_id, positions.cpu(), start, all_logits, first_row, eager, layout)

        def before_stage(k: int) -> None:
            if k > 0 and cancel is not None and cancel():
                raise StepCancelled(f"step {step_id} cancelled between stage {k - 1} and stage {k}")
            if self.fault_hook is not None:
                self.fault_hook(k, step_id)
            if k == 0 and cancel is not None and cancel():  # also one-stage pipelines, every prefill chunk
                raise StepCancelled(f"step {step_id} cancelled before it started")

        try:
            pos = self.segment.put_positions(step, tuple(tokens.shape))
            if self._token_ready is not None:  # greedy_token wrote the entry's input from another GPU
                torch.cuda.current_stream(self.entry_device).wait_event(self._token_ready)
                self._token_ready = None
            if tokens.device.type == "cpu":
                x = (tokens.pin_memory() if self._pin else tokens).to(self.entry_device, non_blocking=True)
            else:  # a token sampled on a device (the generator's lookahead): never through the host
                x = tokens
            out, timed = self.segment.run(step, x, pos, before_stage, self.timing)
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
        self.last_timings = StepTimings(timed.stage_s, timed.handoff_s, timed.handoff_device_s)
        return out

    def submit(self, tokens: torch.Tensor | WorkerTokens, positions: torch.Tensor, start: int | None = None,
               all_logits: bool = False, first_row: int = 0, eager: bool = False,
               greedy: bool = False, layout: StepLayout | None = None) -> StepHandle:
        """Launch a step as :meth:`step` does; its output (or typed error) comes from the handle. Up to
        :attr:`max_in_flight` steps over disjoint rows may be launched before their results are read;
        a step over rows of an unsettled one waits for it. ``greedy``: the caller needs only each
        row's greedy token and log-probability (a pipeline may then return ``pairs`` for the logits).
        ``layout``: a packed step, as :meth:`step` takes it. Here the step is settled at once: its
        failure raises from this call, as :meth:`step`'s does. A ``greedy`` step's output has the
        ``pairs`` (host copy, complete at the handle's ``ready``) and, on a CUDA exit, the handle the
        tokens on that device; its logits stay (in process they cost nothing to keep). Its handles never
        name a worker's tokens (:class:`WorkerTokens`): such ``tokens`` raise ValueError."""
        if isinstance(tokens, WorkerTokens):
            raise ValueError(f"an in-process pipeline holds no worker's tokens (step {tokens.step_id}'s)")
        out = self.step(tokens, positions, start, all_logits, first_row=first_row, eager=eager, layout=layout)
        if not greedy or all_logits or out.logits is None:
            return StepHandle(out)
        device_tokens, pairs, ready = read_greedy_pairs(out.logits[:, -1])  # (P, 1), (P, 2)
        return StepHandle(StageOutput(out.hidden, out.logits, pairs), device_tokens if self.run_ahead else None, ready)

    def rollback(self) -> None:
        for stage in self.stages:
            stage.rollback()

    def reset(self, slot: int) -> None:
        """Start a new sequence in ``slot`` on every stage."""
        for stage in self.stages:
            stage.reset(slot)

    @property
    def kv_pool(self) -> KVPool | None:
        """The KV pool every stage holds (same blocks, same table), or None when no stage holds one."""
        table = next((s.block_table for s in self.stages if s.block_table is not None), None) if self.supports_rows else None
        if table is None:
            return None
        return KVPool(table.num_blocks, table.block_tokens, table.blocks_per_row)

    def set_blocks(self, row: int, block_ids: Sequence[int]) -> None:
        """Row ``row``'s KV lives in blocks ``block_ids`` (position order) on every stage; the rest of its
        block-table row points at the scratch block. In stream order with the steps (no host sync)."""
        for stage in self.stages:
            stage.set_blocks(row, block_ids)

    def move(self, src: int, dst: int) -> None:
        """Move sequence row ``src`` to row ``dst`` on every stage: its block-table row and recurrent
        entries move (the state stays where it is: nothing is copied)."""
        for stage in self.stages:
            stage.move(src, dst)

    def restore(self, row: int, entry: int) -> None:
        """Row ``row``'s next step reads recurrent-state entry ``entry`` (a prefix snapshot) on every stage."""
        for stage in self.stages:
            stage.restore(row, entry)

    @property
    def snapshot_entries(self) -> range:
        """The recurrent-state entries every stage keeps for prefix snapshots (the same on every stage
        that keeps recurrent state; empty where none does)."""
        slots = next((s.states.slots for s in self.stages if s.states is not None and s.states.slots is not None), None)
        return range(slots.first_snapshot, slots.entries) if slots is not None else range(0)

    @property
    def step_graphs(self) -> bool:
        """Whether steps replay CUDA graphs (the batcher then pads decode groups to graph buckets)."""
        return any(getattr(stage, "graphs", None) is not None for stage in self.stages)

    @property
    def max_in_flight(self) -> int:
        """Steps the pipeline overlaps (the batcher's default micro-batches): one per stage, each stage
        running another micro-batch while the host launches ahead."""
        return len(self.stages)

    @property
    def rows(self) -> int:
        """Sequence slots (state rows) the stages hold."""
        return self.stages[0].batch if self.supports_rows else 1

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
