"""Stage: one device's part of the pipeline — its weights, block state, workspace and ledger."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stagewise.kernels.triton_launch import triton_selected
from stagewise.models.block_table import BlockTable
from stagewise.models.layers.attention import Attention
from stagewise.models.registry import build_stage
from stagewise.models.stage_model import StageModel, StageOutput
from stagewise.models.stage_states import StageStates
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.ledger import MemoryLedger
from stagewise.runtime.packed_graphs import PackedGraphs
from stagewise.runtime.peak_memory import PeakMemory
from stagewise.runtime.step_graphs import StepGraphs
from stagewise.spec.kv_pool import default_pool_blocks
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.stage_loader import load_stage
from stagewise.weights.tensor_source import TensorSource, resident_bytes

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class StageSpec:
    """What one stage runs: blocks ``[start, end)`` on ``device`` (a placement device id such as
    ``cpu:1``) executing on ``torch_device``, within ``budget_bytes``; planned charges if known."""

    index: int
    device: str
    torch_device: str
    start: int
    end: int
    entry: bool
    exit: bool
    budget_bytes: int
    planned_weights_bytes: int = 0
    planned_state_bytes: int = 0
    planned_workspace_bytes: int = 0
    planned_reserve_bytes: int = 0
    kv_dtype: str | None = None  # "fp8": keys and values kept as float8 e4m3 with scales; None: the run dtype

    def __post_init__(self) -> None:
        if self.start > self.end or self.start < 0:
            raise ValueError(f"stage {self.index}: bad block range [{self.start}, {self.end})")


@dataclass(frozen=True)
class ChargeCheck:
    """Planned vs measured bytes of one stage: ``planned_bytes`` / ``measured_bytes`` are weights + state
    (counted from the tensors after loading); the parts follow, with the workspace measured as the
    device's allocator peak above its resident tensors (:class:`PeakMemory`) and ``measured_peak_bytes``
    that peak; both None when not measured (before warm-up, off CUDA, in a worker, a shared device)."""

    stage: int
    device: str
    planned_bytes: int
    measured_bytes: int
    planned_weights_bytes: int = 0
    measured_weights_bytes: int = 0
    planned_state_bytes: int = 0
    measured_state_bytes: int = 0
    planned_workspace_bytes: int = 0
    measured_workspace_bytes: int | None = None
    planned_total_bytes: int = 0  # weights + state + workspace + reserve: the certified charge
    measured_peak_bytes: int | None = None

    @property
    def ratio(self) -> float:
        return self.planned_bytes / self.measured_bytes if self.measured_bytes else 1.0

    @property
    def peak_ratio(self) -> float | None:
        """Measured peak over the certified charge (<= 1: the charge bounded it), or None."""
        if self.measured_peak_bytes is None or not self.planned_total_bytes:
            return None
        return self.measured_peak_bytes / self.planned_total_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "device": self.device,
                "planned": {"weights_bytes": self.planned_weights_bytes, "state_bytes": self.planned_state_bytes,
                            "workspace_bytes": self.planned_workspace_bytes, "total_bytes": self.planned_total_bytes},
                "measured": {"weights_bytes": self.measured_weights_bytes, "state_bytes": self.measured_state_bytes,
                             "workspace_bytes": self.measured_workspace_bytes, "peak_bytes": self.measured_peak_bytes},
                "peak_over_planned": self.peak_ratio}


def _weight_bytes_before_load(model: StageModel, source: TensorSource, dtype: torch.dtype) -> int:
    """Resident bytes the stage's weights will take, computed from shapes before any allocation."""
    total = 0
    seen: set[int] = set()
    modules = dict(model.named_modules())
    available = source.names()  # a fresh set per call: read it once
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        src = name
        if name == "lm_head.weight" and name not in available and model.config.tie_word_embeddings:
            if model.entry:
                continue  # shares the embedding on this stage
            src = "model.embed_tokens.weight"
        owner = modules[name.rpartition(".")[0]]
        if src in available:
            total += resident_bytes(source, src, owner, dtype.itemsize)
        else:
            total += param.numel() * dtype.itemsize  # missing: the loader will say so
    # buffers (the rotary frequencies): built on meta with their final shape and dtype
    return total + sum(b.numel() * b.element_size() for b in model.buffers())


class Stage:
    """Owns its device, its blocks' parameters, its state and its ledger."""

    def __init__(self, spec: StageSpec, model: StageModel, ledger: MemoryLedger, dtype: torch.dtype) -> None:
        self.spec = spec
        self.model = model
        self.ledger = ledger
        self.dtype = dtype
        self.device = torch.device(spec.torch_device)
        self.states: StageStates | None = None
        self.graphs: StepGraphs | None = None  # CUDA-graph steps, enabled by enable_graphs()
        self.packed: PackedGraphs | None = None  # packed steps' graph pieces, enabled by enable_graphs()
        self.max_context = 0
        self.batch = 0  # sequence slots (state rows)
        self.block_table: BlockTable | None = None  # where each row's KV lives, shared by the attention blocks

    @staticmethod
    def load(spec: StageSpec, config: ModelConfig, source: TensorSource, dtype: torch.dtype,
             progress: Progress | None = None) -> Stage:
        """Build the stage on meta, charge its weights, then stream them straight to the device."""
        model = build_stage(config, spec.start, spec.end, spec.entry, spec.exit, device="meta")
        ledger = MemoryLedger(spec.device, spec.budget_bytes)
        ledger.charge("workspace", spec.planned_workspace_bytes, "workspace")
        ledger.charge("weights", _weight_bytes_before_load(model, source, dtype), "weights")
        load_stage(model, source, torch.device(spec.torch_device), dtype, progress)
        model.fuse_projections()
        model.eval()
        return Stage(spec, model, ledger, dtype)

    def allocate_state(self, batch: int, max_context: int, kv_blocks: int | None = None, snapshots: int = 0) -> None:
        """Charge, then allocate, the state of every block: the KV pools of ``kv_blocks`` blocks (default:
        every row's whole context) over one block table of ``batch`` rows, conv / recurrent state in
        entry pools (two entries per row, ``snapshots`` prefix snapshots)."""
        blocks = self._charge_state(batch, max_context, kv_blocks, snapshots)[0].num_blocks
        self.block_table = BlockTable(batch, max_context, blocks, self.device)
        self.states = self.model.new_states(batch, max_context, self.dtype, self.device, self.block_table, snapshots)

    def _charge_state(self, batch: int, max_context: int,
                      kv_blocks: int | None, snapshots: int = 0) -> tuple[BlockTable, StageStates]:
        """The state :meth:`allocate_state` makes, built on the meta device (no memory) and charged to the
        ledger: its block table and states. Records ``batch`` and ``max_context``."""
        blocks = default_pool_blocks(batch, max_context) if kv_blocks is None else kv_blocks
        storage = torch.float8_e4m3fn if self.spec.kv_dtype == "fp8" else None
        for module in self.model.modules():  # every attention block keeps its keys and values so
            if isinstance(module, Attention):
                module.kv_storage = storage
        meta = torch.device("meta")
        table = BlockTable(batch, max_context, blocks, meta)
        planned = self.model.new_states(batch, max_context, self.dtype, meta, table, snapshots)
        nbytes = planned.nbytes
        self.ledger.charge("state", nbytes, f"state for batch {batch} x context {max_context}, {blocks} KV blocks")
        self.max_context = max_context
        self.batch = batch
        return table, planned

    @property
    def recurrent(self) -> bool:
        """Whether this stage keeps recurrent (linear-attention) state: its states hold entry slots (a remote
        stage's described ones too)."""
        return self.states is not None and self.states.slots is not None

    def set_blocks(self, row: int, block_ids: Sequence[int]) -> None:
        """Row ``row``'s KV lives in blocks ``block_ids`` (position order) of this stage's pools."""
        assert self.block_table is not None, "allocate_state first"
        with self._device_context():
            self.block_table.set_row(row, block_ids)

    def enable_graphs(self, packed_tokens: int = 0) -> bool:
        """Replay decode steps (one token per row) as CUDA graphs on this stage's device, and packed steps
        of up to ``packed_tokens`` tokens piece by piece (:class:`PackedGraphs`; 0: packed steps run
        eagerly) where the Triton paths are chosen (the reference path's MoE reads its routed counts on
        the host, which a capture cannot); False where not possible."""
        if self.device.type != "cuda" or self.states is None:
            return False
        input_dtype = torch.long if self.model.entry else self.dtype
        self.graphs = StepGraphs(self.model, self.states, self.device, self.max_context, input_dtype)
        if packed_tokens > 0 and triton_selected():
            self.packed = PackedGraphs(self.model, self.states, self.device, packed_tokens, self.dtype,
                                       self.graphs.pool, self.graphs.stream)
        return True

    def measured_bytes(self) -> int:
        """Weights resident plus state allocated, counted from the real tensors."""
        return self.model.resident_bytes() + (self.states.nbytes if self.states is not None else 0)

    def charge_check(self, peak: PeakMemory | None = None) -> ChargeCheck:
        """Planned vs measured, every part; ``peak``: this stage's device's reading, when it is the
        device's only stage (the workspace and peak are then measured)."""
        s = self.spec
        weights = self.model.resident_bytes()
        state = self.states.nbytes if self.states is not None else 0
        planned = s.planned_weights_bytes + s.planned_state_bytes
        total = planned + s.planned_workspace_bytes + s.planned_reserve_bytes
        return ChargeCheck(s.index, s.device, planned, weights + state, s.planned_weights_bytes, weights,
                           s.planned_state_bytes, state, s.planned_workspace_bytes,
                           peak.workspace_bytes if peak is not None else None, total,
                           peak.peak_bytes if peak is not None else None)

    def graphed(self, steps: int, all_logits: bool) -> bool:
        """Whether a step of ``steps`` tokens per sequence replays a CUDA graph here."""
        return self.graphs is not None and not all_logits and self.graphs.covers(steps)

    def input_slot(self, shape: tuple[int, ...], first_row: int = 0) -> torch.Tensor:
        """The static buffer a graphed step with inputs of ``shape`` at state row ``first_row`` reads:
        writing the input there directly (a channel, the sampler) saves the copy at replay. Only for
        graphed steps."""
        assert self.graphs is not None
        return self.graphs.slots_for(shape, first_row).inputs

    def put_positions(self, positions: torch.Tensor, input_shape: tuple[int, ...], graphed: bool,
                      first_row: int = 0) -> torch.Tensor:
        """Start copying ``positions`` ``(B, T)`` (pinned host memory) to this device, ahead of the step's
        input: into the static buffer a graphed step reads, else a fresh tensor. Returns the tensor to
        pass to :meth:`run`."""
        if not graphed:
            return positions.to(self.device, non_blocking=True)
        assert self.graphs is not None
        slot = self.graphs.slots_for(input_shape, first_row).positions
        slot.copy_(positions, non_blocking=True)
        return slot

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, start: int | None,
            all_logits: bool, first_row: int = 0, kv_end: int | None = None, graph: bool = True,
            layout: StepLayout | None = None) -> StageOutput:
        """Run one step: ``inputs`` token ids ``(B, T)`` (entry) or an activation ``(B, T, H)``, on this device
        or another (copied in), at ``positions`` ``(B, T)`` on this device, for state rows ``first_row ..``;
        ``kv_end``: the largest position + 1 (needed to replay a graph; known to the host); ``graph``
        False: run eagerly even where a graph would be replayed; ``layout``: a packed step (its pieces
        replayed where :class:`PackedGraphs` covers it and ``graph``, else :meth:`StageModel.forward`)."""
        if layout is not None and graph and self.packed is not None and self.packed.covers(layout.tokens):
            return self.packed.run(inputs, positions, layout)
        if kv_end is None and start is not None:
            kv_end = start + int(inputs.shape[1])
        if graph and layout is None and kv_end is not None and self.graphed(inputs.shape[1], all_logits):
            assert self.graphs is not None
            return self.graphs.run(inputs, positions, kv_end, first_row)
        if inputs.device != self.device:
            inputs = inputs.to(self.device, non_blocking=True)
        # NOTE: Triton kernels launch on the *current* CUDA device, not the tensors' device: make
        # this stage's device current, or a second GPU's stage would run its kernels on the first
        assert self.states is not None, "allocate_state first"
        with self._device_context(), torch.inference_mode():
            return self.model(inputs, positions, self.states, start=start, all_logits=all_logits,
                              first_row=first_row, layout=layout)

    def _device_context(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def publish(self, rows: Iterable[int] | None = None) -> None:
        """Accept the provisional state of the step that ran ``rows`` (of every step not settled: None)."""
        if self.states is not None:
            self.states.publish(rows)

    def rollback(self, rows: Iterable[int] | None = None) -> None:
        """Discard the provisional state of the step that ran ``rows`` (of every step not settled: None)."""
        if self.states is not None:
            self.states.rollback(rows)

    def reset(self, slot: int) -> None:
        if self.states is not None:
            with self._device_context():
                self.states.reset(slot)

    def restore(self, row: int, entry: int) -> None:
        """Row ``row``'s next step reads recurrent-state entry ``entry`` (a prefix snapshot)."""
        if self.states is not None and self.states.slots is not None:
            with self._device_context():
                self.states.slots.restore(row, entry)

    def move(self, src: int, dst: int) -> None:
        """Move sequence row ``src`` to row ``dst``: its block-table row and recurrent entries move
        (``src`` keeps no blocks); no state is copied."""
        assert self.states is not None, "allocate_state first"
        with self._device_context():
            self.states.move(src, dst)

    def close(self) -> None:
        """Free the stage's device memory."""
        self.graphs = None
        self.packed = None
        self.states = None
        self.block_table = None
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

