"""StageTable: prefix sums that price any stage ``[a, b)`` in O(1) for the planner's search.

Every number is an integer computed by the same functions :func:`stage_charge` and the cost
model use, so a table charge equals ``stage_charge(...).total_bytes`` exactly (tests check).
"""

from __future__ import annotations

from dataclasses import dataclass

from stagewise.hardware.device_info import DeviceInfo
from stagewise.placement.cost_model import block_decode_ps, end_decode_ps
from stagewise.spec.charge import reserve_for
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.state_bytes import block_state_bytes
from stagewise.spec.workspace_bytes import (
    F32_BYTES,
    block_workspace_bytes,
    graph_output_bytes,
    graph_pool_top_up_bytes,
    handoff_buffer_bytes,
    logits_buffer_bytes,
    packed_graph_bytes,
    runtime_bytes,
)


def _prefix(values: list[int]) -> list[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


@dataclass(frozen=True)
class StageTable:
    """Device-independent byte tables of one (spec, profile)."""

    num_blocks: int
    weight_prefix: list[int]
    state_prefix: list[int]
    workspace: list[int]
    handoff_buffer: int  # per stage: the handoff buffers, the runtime's workspace, the graphs' buffers and pool top-up
    logits_buffer: int
    entry_only_step: int  # a stage holding the entry and no block: the rows it embeds
    graph_outputs: tuple[int, int]  # without / with the exit: what the stage's CUDA graphs keep
    entry_weight: int
    exit_weight: int
    shared: int
    stage_weight: int  # tables every stage keeps (the rotary frequencies)

    @staticmethod
    def build(spec: ModelSpec, profile: Profile) -> StageTable:
        return StageTable(
            num_blocks=spec.num_blocks,
            weight_prefix=_prefix([b.weight_bytes for b in spec.blocks]),
            state_prefix=_prefix([block_state_bytes(b, profile) for b in spec.blocks]),
            workspace=[block_workspace_bytes(b, profile, spec.format) for b in spec.blocks],
            handoff_buffer=(handoff_buffer_bytes(spec.hidden_size, profile) + runtime_bytes(profile)
                            + packed_graph_bytes(spec, profile) + graph_pool_top_up_bytes(spec, profile)),
            logits_buffer=logits_buffer_bytes(spec.vocab_size, profile, spec.hidden_size, spec.format),
            entry_only_step=profile.step_tokens * spec.hidden_size * (profile.activation_bytes + F32_BYTES),
            graph_outputs=(graph_output_bytes(spec, profile, False), graph_output_bytes(spec, profile, True)),
            entry_weight=spec.entry.weight_bytes,
            exit_weight=spec.exit.weight_bytes,
            shared=spec.exit.shared_bytes,
            stage_weight=spec.stage_table_bytes,
        )

    def total(self, a: int, b: int, entry: bool, exit: bool, workspace_max: int) -> int:
        """Total charge of ``[a, b)`` given the max block workspace over the range."""
        w = self.weight_prefix[b] - self.weight_prefix[a] + self.stage_weight
        if entry:
            w += self.entry_weight
        if exit:
            w += self.exit_weight - (self.shared if entry else 0)
        s = self.state_prefix[b] - self.state_prefix[a]
        if entry and a == b:
            workspace_max = self.entry_only_step
        ws = workspace_max + self.handoff_buffer + (self.logits_buffer if exit else 0)
        ws += self.graph_outputs[exit]
        return w + s + ws + reserve_for(w, s, ws)

    def range_total(self, a: int, b: int, entry: bool, exit: bool) -> int:
        return self.total(a, b, entry, exit, max(self.workspace[a:b], default=0))


@dataclass(frozen=True)
class DeviceCosts:
    """Decode picoseconds of every block on one device, as prefix sums, plus its budget."""

    device_id: str
    budget_bytes: int
    cost_prefix: list[int]
    entry_ps: int
    exit_ps: int

    @staticmethod
    def build(spec: ModelSpec, profile: Profile, device: DeviceInfo) -> DeviceCosts:
        return DeviceCosts(
            device_id=device.id,
            budget_bytes=device.budget_bytes,
            cost_prefix=_prefix([block_decode_ps(b, device, profile) for b in spec.blocks]),
            entry_ps=end_decode_ps(spec.entry, device, profile),
            exit_ps=end_decode_ps(spec.exit, device, profile),
        )

    def cost(self, a: int, b: int, entry: bool, exit: bool) -> int:
        c = self.cost_prefix[b] - self.cost_prefix[a]
        return c + (self.entry_ps if entry else 0) + (self.exit_ps if exit else 0)
