"""StepContext: what every block of a stage needs to know about the step being run."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from stagewise.models.layers.packed_segments import PackedSegments
from stagewise.models.layers.rotary import rotary_cos_sin
from stagewise.models.state_slots import StateSlots
from stagewise.models.step_layout import StepLayout


def causal_mask(positions: torch.Tensor, kv_length: int, query_groups: int = 1) -> torch.Tensor:
    """``(B, 1, G·T, kv_length)``: True where key position ``j <=`` the query's position, for
    ``positions`` ``(B, T)``, repeated for the ``G`` query heads of a KV head (group-major)."""
    keys = torch.arange(kv_length, device=positions.device)
    mask = (keys[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, T, L)
    if query_groups > 1:
        mask = mask.repeat(1, 1, query_groups, 1)  # (B, 1, G*T, L)
    return mask


@dataclass(frozen=True)
class StepContext:
    """Positions and masks for one step over ``B`` sequences of ``T`` new tokens each.

    ``positions`` ``(B, T)`` are absolute; ``start`` is the common first position when every
    sequence's positions are ``start .. start+T-1``; ``kv_length`` is ``max(positions) + 1``;
    ``mask`` ``(B, 1, G·T, kv_length)`` is True where key position ``j <= `` query position: the
    causal mask repeated for the ``G`` query heads that share a KV head (grouped-query attention
    folds them into G·T query rows, group-major), built on first use, once per step for every
    attention block (a GPU decode step's attention kernel reads the positions instead: no mask).
    ``rows`` the state rows (sequence slots) of the step's ``B`` sequences, in order.
    ``inv_freq`` ``(rotary_dim // 2,)`` float32: the rotary frequencies; ``rotary`` the reference
    path's ``(cos, sin)`` tables ``(B, T, rotary_dim)`` in ``dtype``, also built on first use (the
    Triton path computes the angles inside its rotary kernel and never builds them).
    ``layout``: a packed step (:class:`StepLayout`): ``B`` is its ``N`` tokens, ``T`` is 1, and each
    token's state row is ``token_rows[i]`` (``rows`` is then unused).
    """

    positions: torch.Tensor
    start: int | None
    kv_length: int
    inv_freq: torch.Tensor
    dtype: torch.dtype
    query_groups: int = 1
    rows: slice = field(default_factory=lambda: slice(0, 1))
    layout: StepLayout | None = None
    slots: StateSlots | None = None

    @functools.cached_property
    def slot_entries(self) -> torch.Tensor:
        """Each segment's ``[read, write]`` recurrent-state entries ``(S, 2)`` int32 (:class:`StateSlots`),
        read once for every linear-attention block: a packed step's segments in order (gathered from
        the stage's table), or a rectangle step's ``B`` rows (a view of the table: a captured graph
        reads the entries current at each replay)."""
        assert self.slots is not None, "only a stage with recurrent state has state slots"
        if self.layout is None:
            return self.slots.table[self.rows]
        rows = _on_device(list(self.layout.rows), self.positions.device)
        return self.slots.table.index_select(0, rows)

    @functools.cached_property
    def state_segments(self) -> PackedSegments:
        """The step's prompt segments as the linear-attention blocks run them, built once for all of
        them from the host's state slots: each segment's read and write entries (its row's), its
        snapshot where the layout takes one, token offsets past the decoding rows."""
        slots = self.slots
        assert slots is not None, "only a stage with recurrent state has state slots"
        decoding, offsets = self.segment_offsets
        if self.layout is not None:
            rows = self.layout.rows[decoding:]
            snaps = {s - decoding: (tokens, entry) for s, tokens, entry in self.layout.snapshots}
        else:
            rows = tuple(range(self.rows.start, self.rows.start + self.batch))
            snaps = {}
        lengths = [b - a for a, b in zip(offsets[decoding:], offsets[decoding + 1 :], strict=False)]
        return PackedSegments.build(lengths, [slots.read_entry(r) for r in rows], [slots.write_entry(r) for r in rows],
                                    self.positions.device, [snaps[s][1] if s in snaps else 0 for s in range(len(rows))],
                                    [snaps[s][0] if s in snaps else 0 for s in range(len(rows))], offsets[decoding])

    @property
    def segment_offsets(self) -> tuple[int, tuple[int, ...]]:
        """The step's segments on the host: how many of the first are decoding rows (one token each),
        and each segment's first token in the step's token column (then the tokens in all). A packed
        step's are its layout's; a rectangle step's ``B`` rows of ``T`` tokens are ``B`` segments,
        decoding rows when ``T`` is 1."""
        if self.layout is not None:
            return self.layout.decoding, self.layout.offsets
        batch, steps = self.batch, self.steps
        return (batch if steps == 1 else 0), tuple(range(0, batch * steps + 1, steps))

    @functools.cached_property
    def rotary(self) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(self.inv_freq, self.positions, self.dtype)

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        return causal_mask(self.positions, self.kv_length, self.query_groups)

    @functools.cached_property
    def token_rows(self) -> torch.Tensor:
        """A packed step's state row of every token ``(N,)`` int64 on the positions' device."""
        assert self.layout is not None, "only a packed step has per-token rows"
        return _on_device(self.layout.token_rows(), self.positions.device)

    @functools.cached_property
    def packed_masks(self) -> tuple[torch.Tensor, ...]:
        """A packed step's causal masks, built once for every attention block: the decoding rows'
        ``(Nd, 1, G, L)`` (first, where there are decoding rows), then each later segment's
        ``(1, 1, G·n, start + n)`` over its own row."""
        layout = self.layout
        assert layout is not None, "only a packed step has per-segment masks"
        offsets, masks = layout.offsets, []
        if layout.decoding:
            length = max(layout.starts[: layout.decoding]) + 1
            masks.append(causal_mask(self.positions[: offsets[layout.decoding]], length, self.query_groups))
        for s in range(layout.decoding, len(layout.rows)):
            segment = self.positions[offsets[s] : offsets[s + 1]].view(1, -1)  # (1, n)
            masks.append(causal_mask(segment, layout.starts[s] + layout.lengths[s], self.query_groups))
        return tuple(masks)

    @functools.cached_property
    def prompt_segments(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The step's prompt chunks for :func:`~stagewise.kernels.prefill_attention_triton.prefill_attention`,
        built once for every attention block: token offsets ``(S + 1,)`` and state rows ``(S,)``, int32 on
        the positions' device, and the longest chunk's tokens. A rectangle step's ``B`` rows of ``T``
        tokens (built on the device: a captured graph holds no host copy); a packed step's segments after
        its decoding rows (their offsets count the decoding rows' tokens too)."""
        device = self.positions.device
        if self.layout is None:
            batch, steps = self.batch, self.steps
            offsets = torch.arange(batch + 1, dtype=torch.int32, device=device) * steps
            rows = torch.arange(self.rows.start, self.rows.start + batch, dtype=torch.int32, device=device)
            return offsets, rows, steps
        layout = self.layout
        prompts = range(layout.decoding, len(layout.rows))
        count = len(prompts)
        # NOTE: the rows start 16 bytes into the buffer's alignment whatever the count: Triton specializes
        # a kernel on each pointer's alignment (kernels/kernel_variants.py)
        gap = [0] * (-(count + 1) % 4)  # int32 values up to the next 16 bytes
        table = _on_device([*layout.offsets[layout.decoding :], *gap, *(layout.rows[s] for s in prompts)], device,
                           torch.int32)
        return table[: count + 1], table[count + 1 + len(gap) :], max((layout.lengths[s] for s in prompts), default=0)

    @functools.cached_property
    def logit_tokens(self) -> torch.Tensor:
        """A packed step's tokens whose logits the exit computes ``(S,)`` int64 on the positions' device."""
        assert self.layout is not None, "only a packed step selects its logit tokens"
        return _on_device(self.layout.logit_tokens(), self.positions.device)

    @property
    def batch(self) -> int:
        return int(self.positions.shape[0])

    @property
    def steps(self) -> int:
        return int(self.positions.shape[1])

    @staticmethod
    def build(positions: torch.Tensor, start: int | None, kv_length: int, inv_freq: torch.Tensor,
              dtype: torch.dtype, query_groups: int = 1, first_row: int = 0,
              layout: StepLayout | None = None, slots: StateSlots | None = None) -> StepContext:
        rows = slice(first_row, first_row + int(positions.shape[0]))
        return StepContext(positions, start, kv_length, inv_freq, dtype, query_groups, rows, layout, slots)


def _on_device(values: list[int], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``values`` as ``dtype`` (int64 unless said) on ``device``, in stream order (pinned on the host: the copy never waits for
    the steps already queued, which a copy from pageable memory would)."""
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
    return host.to(device, non_blocking=True)
