"""PackedGraphs: one stage's packed steps replayed as CUDA graphs, piece by piece.

A packed step (prompt chunks beside decoding rows, :class:`~stagewise.models.step_layout.StepLayout`)
launches hundreds of kernels, most of them token by token (norms, projections, the MLP or MoE); run
eagerly, a step of a few hundred tokens costs the host more than the GPU (issue 44: 71-85 ms of wall
for 20 ms of kernels). What depends on the layout is each block's mixer (attention's key store and
per-segment attention, the linear-attention conv and delta rule: grids and tables that change with
the segments), so a step is cut at the mixers (vLLM's piecewise graphs): piece ``j`` is block ``j-1``'s
:meth:`~stagewise.models.stage_model.Block.end` and block ``j``'s ``begin`` (piece 0 the embedding and
block 0's ``begin``, the last piece the last block's ``end``), captured once per token bucket, and the
mixers run eagerly between the replays over the step's real tokens.

Tokens are padded up to a bucket (:func:`token_buckets`: 16, 24, 32, 48, 64, 96 ... up to the most a
step carries, ``Profile.step_tokens``: at most a third of a bucket is padding); a padding token runs
the token-wise work only (no mixer reads or writes it, no state sees it) and nothing of it reaches a
real token: every piece works token by token. What crosses a
cut lives in static buffers sized for the largest bucket, shared by every bucket and by every block
whose tensors have the same shape: a piece reads the previous block's carry (the residual stream and
the mixer's projections, :meth:`Block.begin`) and mixer output, then overwrites the carry buffers last,
so one set serves all blocks. Every graph of a stage shares one memory pool (the decode graphs' too):
the pieces replay one after another, never concurrently.

A bucket's first step runs the pieces eagerly at the bucket's size (compiling what the capture needs)
and returns that step's result; its pieces are then captured (nothing runs) and replayed from the
next step on. Stage.run gives a step past the largest bucket (none, as the batcher plans them) to
:meth:`StageModel.forward`, eagerly; stages take pieces only where the Triton paths are chosen. Off
CUDA (tests) a replay runs its piece again, eagerly: the same cuts, buffers and padding, no capture.
Results equal the eager step's up to the padding: the token-wise kernels
may pick other tiles for a bucket's row count than for the step's, so bits can differ from an unpadded
run, never between stages or runs that pad alike.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from stagewise.models.stage_model import StageModel, StageOutput
from stagewise.models.stage_states import StageStates
from stagewise.models.step_layout import StepLayout
from stagewise.spec.workspace_bytes import largest_token_bucket

SMALLEST_BUCKET = 16


class _Replay(Protocol):
    def replay(self) -> None: ...


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """Token counts a packed step is padded to: 16, then each power of two and three quarters of it (24, 32,
    48, 64, 96, 128, 192 ...) below the largest, :func:`~stagewise.spec.workspace_bytes.largest_token_bucket`
    of ``max_tokens`` (what the plan charges the buffers for)."""
    top = largest_token_bucket(max_tokens)
    ladder = [SMALLEST_BUCKET]
    power = SMALLEST_BUCKET
    while ladder[-1] < top:
        power *= 2
        ladder += [power * 3 // 4, power]
    return tuple(sorted({b for b in ladder if b < top} | {top}))


def token_bucket(tokens: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest of ``buckets`` >= ``tokens``, or None past the largest."""
    return next((b for b in buckets if b >= tokens), None)


class PackedGraphs:
    """Lazily captured packed-step pieces for one stage on one CUDA device (module docstring)."""

    def __init__(self, model: StageModel, states: StageStates, device: torch.device, max_tokens: int,
                 dtype: torch.dtype, pool: Any = None, stream: torch.cuda.Stream | None = None) -> None:
        self.model = model
        self.states = states
        self.device = device
        self.dtype = dtype  # the activations'
        self.buckets = token_buckets(max_tokens)
        self.pool = pool  # torch.cuda.graph_pool_handle(): the stage's graphs' one memory pool
        self.stream = stream
        self.blocks = model.blocks()
        self.indices = list(model.block_indices)
        top, hidden = self.buckets[-1], model.config.hidden_size
        shape = (top, 1) if model.entry else (top, 1, hidden)
        self.inputs = torch.zeros(shape, dtype=torch.long if model.entry else dtype, device=device)
        self.output = torch.zeros((top, 1, hidden), dtype=dtype, device=device)
        self.carry: list[tuple[torch.Tensor, ...] | None] = [None] * len(self.blocks)  # block j's carry buffers
        self.mixed: list[torch.Tensor | None] = [None] * len(self.blocks)  # block j's mixer output buffer
        self._shared: dict[tuple[object, ...], torch.Tensor] = {}  # buffers by role, shape and dtype
        self.graphs: dict[int, list[_Replay]] = {}

    def covers(self, tokens: int) -> bool:
        """Whether a packed step of ``tokens`` tokens runs here (padded to a bucket)."""
        return tokens <= self.buckets[-1]

    @property
    def nbytes(self) -> int:
        """Bytes of the static buffers (inputs, output, carries, mixer outputs); the pieces' temporaries
        live in the shared graph pool."""
        tensors = [self.inputs, self.output, *self._shared.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def run(self, inputs: torch.Tensor, positions: torch.Tensor, layout: StepLayout) -> StageOutput:
        """Run the packed step ``layout`` of ``inputs`` (``(N, 1)`` token ids or ``(N, 1, H)``) at ``positions``
        ``(N, 1)`` on this device: the pieces replayed (captured after the bucket's first, eager, step),
        the mixers eagerly over the ``N`` real tokens."""
        tokens = layout.tokens
        bucket = token_bucket(tokens, self.buckets)
        if bucket is None:
            raise ValueError(f"a packed step of {tokens} tokens is past the largest graph bucket ({self.buckets[-1]})")
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        with on_device, torch.inference_mode():
            ctx = self.model.context(positions, None, self.dtype, None, 0, layout, self.states.slots)
            self.states.begin(layout.rows)
            self.inputs[:tokens].copy_(inputs, non_blocking=True)
            graphs = self.graphs.get(bucket)
            for j in range(len(self.blocks) + 1):
                if graphs is None:
                    self._piece(j, bucket)
                else:
                    graphs[j].replay()
                if j < len(self.blocks):
                    self._mix(j, tokens, ctx)
            if graphs is None:
                self.graphs[bucket] = self._capture(bucket)
            hidden = self.output[:tokens]
            if self.model.exit:
                return self.model.head(hidden, ctx)
            return StageOutput(hidden.clone(), None)  # the buffer is the next step's: hand over a copy

    def _piece(self, j: int, bucket: int) -> None:
        """Piece ``j`` over ``bucket`` tokens: block ``j-1``'s end (the input's embedding for ``j`` 0), then
        block ``j``'s begin, its carry written into the static buffers last (the last piece: the output)."""
        if j == 0:
            hidden = self.model.embed(self.inputs[:bucket])
        else:
            carry = self.carry[j - 1]
            mixed = self.mixed[j - 1]
            assert carry is not None and mixed is not None
            hidden = self.blocks[j - 1].end(tuple(t[:bucket] for t in carry), mixed[:bucket])
        if j == len(self.blocks):
            self.output[:bucket].copy_(hidden)
            return
        outputs = self.blocks[j].begin(hidden)
        if self.carry[j] is None:
            self.carry[j] = tuple(self._buffer(("carry", k), t) for k, t in enumerate(outputs))
        buffers = self.carry[j]
        assert buffers is not None
        for buffer, t in zip(buffers, outputs, strict=True):
            buffer[:bucket].copy_(t)

    def _mix(self, j: int, tokens: int, ctx: object) -> None:
        """Block ``j``'s mixer over the step's ``tokens`` real tokens, into its static output buffer."""
        carry = self.carry[j]
        assert carry is not None
        state = self.states[self.indices[j]]
        real = tuple(t[:tokens] for t in carry)
        buffer = self.mixed[j]
        if buffer is None:  # the first step: the output's shape is learnt from it
            mixed = self.blocks[j].mix(real, ctx, state)  # type: ignore[arg-type]
            buffer = self.mixed[j] = self._buffer(("mixed",), mixed)
            buffer[:tokens].copy_(mixed)
            return
        self.blocks[j].mix(real, ctx, state, out=buffer[:tokens])  # type: ignore[arg-type]

    def _buffer(self, role: tuple[object, ...], like: torch.Tensor) -> torch.Tensor:
        """The static buffer for tensors like ``like`` (any token count) in ``role``: shared by every block
        whose tensors in that role have the same shape and dtype; zeros (padding rows stay finite)."""
        key = (*role, tuple(like.shape[1:]), like.dtype)
        buffer = self._shared.get(key)
        if buffer is None:
            buffer = torch.zeros((self.buckets[-1], *like.shape[1:]), dtype=like.dtype, device=self.device)
            self._shared[key] = buffer
        return buffer

    def _capture(self, bucket: int) -> list[_Replay]:
        """Capture every piece at ``bucket`` tokens (nothing runs). The bucket's kernels were compiled by the
        eager step just run, at the same sizes and buffers. Off CUDA: each piece run again at replay."""
        if self.device.type != "cuda" or self.stream is None:
            return [_Rerun(self, j, bucket) for j in range(len(self.blocks) + 1)]
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        graphs: list[_Replay] = []
        with torch.cuda.stream(self.stream):
            for j in range(len(self.blocks) + 1):
                graph = torch.cuda.CUDAGraph()
                # NOTE: capture_begin/end rather than torch.cuda.graph(), which synchronizes, collects
                # garbage and empties the allocator's cache around every capture: 40-odd pieces a bucket.
                # thread_local: the server's other threads may touch CUDA (metrics) meanwhile
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    self._piece(j, bucket)
                finally:
                    graph.capture_end()
                graphs.append(graph)
        current.wait_stream(self.stream)
        return graphs


@dataclass(frozen=True)
class _Rerun:
    """A piece's replay off CUDA: the piece run again, eagerly."""

    graphs: PackedGraphs
    piece: int
    bucket: int

    def replay(self) -> None:
        self.graphs._piece(self.piece, self.bucket)
