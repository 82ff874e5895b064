"""StageModel: the part of a model one stage runs — blocks [start, end), plus entry and/or exit.

Parameter names keep the Hugging Face checkpoint's (``model.embed_tokens.weight``,
``model.layers.<global index>.…``, ``model.norm.weight``, ``lm_head.weight``), so weight name maps
are small tables. An exit stage always has ``lm_head``; with tied embeddings its weight is read
from ``model.embed_tokens.weight`` (and shared with the embedding when one stage owns both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from stagewise.models.block_table import BlockTable
from stagewise.models.layers.embedding import Embedding
from stagewise.models.layers.linear import Linear
from stagewise.models.layers.rms_norm import RMSNorm
from stagewise.models.layers.rotary import inverse_frequencies
from stagewise.models.stage_states import StageStates
from stagewise.models.state_slots import StateSlots
from stagewise.models.step_context import StepContext
from stagewise.models.step_layout import StepLayout
from stagewise.spec.kv_pool import default_pool_blocks
from stagewise.spec.model_config import ModelConfig

BlockFactory = Callable[[ModelConfig, int], nn.Module]


class Block(Protocol):
    """A decoder block as a packed step's graph pieces run it: ``forward(hidden, ctx, state)`` is
    ``end(carry, mix(carry, ctx, state))`` with ``carry = begin(hidden)``; ``begin`` and ``end`` work
    token by token (no step context: the same kernels whatever the layout), ``mix`` reads the step's
    layout and the block's state."""

    def begin(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]: ...

    def mix(self, carry: tuple[torch.Tensor, ...], ctx: StepContext, state: Any,
            out: torch.Tensor | None = None) -> torch.Tensor: ...

    def end(self, carry: tuple[torch.Tensor, ...], mixed: torch.Tensor) -> torch.Tensor: ...


_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "int64",
                torch.int32: "int32", torch.uint8: "uint8"}


@dataclass(frozen=True)
class StageOutput:
    """``hidden``: the activation handed to the next stage ``(B, T, H)``, or at the exit the final
    normed features of the positions with logits; ``logits`` ``(B, T', V)`` float32 at the exit;
    ``pairs`` ``(B, 2)``: each row's greedy token and log-probability instead of the logits, where the
    step was asked for only those (a distributed pipeline's exit worker computes them; ``hidden`` is
    then empty)."""

    hidden: torch.Tensor
    logits: torch.Tensor | None
    pairs: torch.Tensor | None = None


class _Body(nn.Module):
    """The ``model.`` namespace of the checkpoint: embedding, blocks by global index, final norm."""

    def __init__(self, config: ModelConfig, start: int, end: int, entry: bool, exit: bool,
                 block_factory: BlockFactory) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size) if entry else None
        self.layers = nn.ModuleDict({str(i): block_factory(config, i) for i in range(start, end)})
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.zero_centered_norm) if exit else None


class StageModel(nn.Module):
    """Blocks ``[start, end)`` of ``config``; owns the entry and/or exit if asked."""

    def __init__(self, config: ModelConfig, start: int, end: int, entry: bool, exit: bool,
                 block_factory: BlockFactory) -> None:
        super().__init__()
        if not 0 <= start <= end <= config.num_layers:
            raise ValueError(f"block range [{start}, {end}) outside 0..{config.num_layers}")
        self.config = config
        self.start, self.end, self.entry, self.exit = start, end, entry, exit
        self.model = _Body(config, start, end, entry, exit, block_factory)
        self.lm_head = Linear(config.hidden_size, config.vocab_size) if exit else None
        self.register_buffer("inv_freq", inverse_frequencies(config.rope, config.rotary_dim), persistent=False)

    def init_buffers(self, device: torch.device) -> None:
        """Compute the non-persistent buffers (rotary frequencies) on ``device`` after a meta build."""
        self.inv_freq = inverse_frequencies(self.config.rope, self.config.rotary_dim).to(device)
        for module in self.modules():
            init = getattr(module, "init_buffers_", None)
            if callable(init):
                init(device)

    def fuse_projections(self) -> None:
        """After loading: run q/k/v and gate/up as single matmuls wherever the layers allow it."""
        for module in list(self.modules()):
            fuse = getattr(module, "fuse", None)
            if callable(fuse):
                fuse()

    def resident_bytes(self) -> int:
        """Bytes of weights resident for this stage: every kind of :meth:`resident_by_dtype`."""
        return sum(self.resident_by_dtype().values())

    def resident_by_dtype(self) -> dict[str, int]:
        """Bytes resident for this stage's weights, by kind: dense parameters (shared ones once) by dtype
        (``bf16``, ``f32``), packed ones by type (``q4_k``), their input gathers (``int64``), and the
        buffers (the rotary frequencies, ``f32``) — counted from the tensors themselves."""
        out: dict[str, int] = {}

        def add(kind: str, nbytes: int) -> None:
            out[kind] = out.get(kind, 0) + nbytes

        for p in self.parameters():  # parameters() dedupes ties
            add(_DTYPE_NAMES.get(p.dtype, str(p.dtype)), p.numel() * p.element_size())
        for b in self.buffers():
            add(_DTYPE_NAMES.get(b.dtype, str(b.dtype)), b.numel() * b.element_size())
        packed: dict[int, object] = {}  # by identity: a tied packed table is held by the embedding and the head
        for module in self.modules():
            get = getattr(module, "quantized_weights", None)
            if callable(get):
                packed.update((id(q), q) for q in get())
        for q in packed.values():
            add(q.format_name, q.nbytes)  # type: ignore[attr-defined]
            index = getattr(q, "input_index", None)
            if index is not None:
                add(_DTYPE_NAMES.get(index.dtype, str(index.dtype)), index.numel() * index.element_size())
        return out

    @property
    def block_indices(self) -> range:
        return range(self.start, self.end)

    def tie_embeddings(self) -> None:
        """Share the embedding matrix with the LM head (tied checkpoints, entry+exit on one stage)."""
        embed, head = self.model.embed_tokens, self.lm_head
        if embed is None or head is None or not self.config.tie_word_embeddings:
            return
        if embed.quantized is not None:  # one packed table serves both (a PackedWeight is both kinds)
            head.set_quantized(embed.quantized)  # type: ignore[arg-type]
        else:
            head.weight = embed.weight

    def new_states(self, batch: int, max_context: int, dtype: torch.dtype, device: torch.device,
                   table: BlockTable | None = None, snapshots: int = 0) -> StageStates:
        """Fresh state for every block of this stage: KV pools over ``table`` (one table for the whole
        stage; without one, an identity table of ``batch`` rows of ``max_context``), conv + recurrent
        state in entry pools over one :class:`StateSlots` of ``batch`` rows and ``snapshots`` prefix
        snapshots (where a block keeps recurrent state)."""
        if table is None:
            table = BlockTable(batch, max_context, default_pool_blocks(batch, max_context), device)
        linear = any(getattr(self.model.layers[str(i)], "is_linear", False) for i in self.block_indices)
        slots = StateSlots(batch, device, snapshots) if linear else None
        blocks = {i: self.model.layers[str(i)].new_state(batch, max_context, dtype, device, table, slots)  # type: ignore[operator]
                  for i in self.block_indices}
        return StageStates(blocks, table, slots)

    def context(self, positions: torch.Tensor, start: int | None, dtype: torch.dtype,
                kv_length: int | None = None, first_row: int = 0, layout: StepLayout | None = None,
                slots: StateSlots | None = None) -> StepContext:
        if kv_length is None and layout is not None:
            kv_length = layout.kv_end  # known on the host: a packed step never waits for the device here
        elif kv_length is None:
            kv_length = int(positions.max().item()) + 1 if start is None else start + positions.shape[1]
        groups = self.config.num_attention_heads // self.config.num_kv_heads
        return StepContext.build(positions, start, kv_length, self.inv_freq, dtype, groups, first_row, layout, slots)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, states: StageStates,
                start: int | None = None, all_logits: bool = False, kv_length: int | None = None,
                first_row: int = 0, layout: StepLayout | None = None) -> StageOutput:
        """Run this stage.

        Args:
            inputs: token ids ``(B, T)`` at the entry, else the previous stage's hidden ``(B, T, H)``.
            positions: absolute positions ``(B, T)``.
            states: this stage's block states (written provisionally; the step's rows are begun here).
            start: the common first position, when all rows are contiguous from it.
            all_logits: logits for every position instead of the last only.
            kv_length: attend over this many cache positions (masked causally) instead of the
                step's own extent; with ``start=None`` the step needs no host synchronization
                (CUDA graph capture).
            first_row: the state row of the first sequence; the ``B`` sequences are rows
                ``first_row .. first_row + B - 1`` of every block's state.
            layout: a packed step (:class:`StepLayout`): ``inputs`` ``(N, 1)`` / ``(N, 1, H)`` and
                ``positions`` ``(N, 1)`` are its tokens, each of the row the layout names (``first_row``
                and ``start`` unused); the exit computes the logits of ``layout.logits`` only,
                ``(S, 1, V)`` (None when it names none).
        """
        hidden = self.embed(inputs)  # (B, T, H)
        ctx = self.context(positions, start, hidden.dtype, kv_length, first_row, layout, states.slots)
        states.begin(layout.rows if layout is not None else range(first_row, first_row + int(positions.shape[0])))
        for i in self.block_indices:
            hidden = self.model.layers[str(i)](hidden, ctx, states[i])
        return self.head(hidden, ctx, all_logits)

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """The entry's token embeddings of ``inputs`` ``(B, T)``; elsewhere ``inputs`` (the previous stage's
        activation) as it is."""
        return self.model.embed_tokens(inputs) if self.model.embed_tokens is not None else inputs

    def blocks(self) -> list[Block]:
        """This stage's blocks in order: what a packed step's graph pieces run between their mixers."""
        return [self.model.layers[str(i)] for i in self.block_indices]  # type: ignore[misc]

    def head(self, hidden: torch.Tensor, ctx: StepContext, all_logits: bool = False) -> StageOutput:
        """The stage's output of its last block's ``hidden``: the activation itself, or at the exit the
        final norm and the logits of the positions that have them (a packed step's layout's ``logits``
        segments; a rectangle's last position of each row, or every position with ``all_logits``)."""
        if self.model.norm is None or self.lm_head is None:
            return StageOutput(hidden, None)
        if ctx.layout is not None:
            if not ctx.layout.logits:
                return StageOutput(hidden[:0], None)
            hidden = hidden.index_select(0, ctx.logit_tokens)  # (S, 1, H)
        elif not all_logits:
            hidden = hidden[:, -1:]
        features = self.model.norm(hidden)
        logits = self.lm_head(features).float()  # (B, T', V)
        return StageOutput(features, logits)
