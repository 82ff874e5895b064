"""PackedSegments: where a packed step's prompt segments read, write and snapshot linear-attention state.

A linear-attention block keeps its state as a pool of entries (``conv`` ``(E, C, K)``, ``recurrent``
``(E, Hv, Dk, Dv)``); entry 0 is all zeros and never written (a fresh sequence reads it). A packed
step's column of ``N`` tokens holds ``S`` segments, segment ``s`` being tokens
``cu_seqlens[s] .. cu_seqlens[s+1] - 1`` of one sequence. Segment ``s`` reads the state before its
first token from entry ``read[s]`` and writes the state after its last token to entry ``write[s]``;
where ``snap_at[s] > 0`` it also writes the state after its first ``snap_at[s]`` tokens (a chunk
boundary: a multiple of :data:`CHUNK`) to entry ``snap[s]`` (a prefix-cache snapshot). A step never
reads and writes the same entry, and no two segments write one entry, so the kernels need no ordering
between segments.

The chunked rule splits each segment into :data:`CHUNK`-token chunks from its first token (the last
one partial); ``chunks`` lists them for the kernels' grids. The scheduler starts every prompt segment
at an absolute position that is a multiple of :data:`CHUNK`, so a prompt's chunks are the same
whichever steps carry it.

Device tensors are int32, built from host integers in one pinned, non-blocking copy
(:meth:`PackedSegments.build`); the host keeps what a launcher needs for its grid (``offsets``,
``snap_tokens``, the chunk count), so no launcher synchronizes the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stagewise.models.state_slots import ZERO_ENTRY  # the pool entry that stays all zeros

CHUNK = 64  # the chunked delta rule's chunk (the reference's), and where prompt segments start
ALIGN_VALUES = 4  # int32 values in 16 bytes: where every field of the device buffer starts


@dataclass(frozen=True)
class PackedSegments:
    """``S`` segments of a packed step and their state entries (module docstring).

    Device (int32, one device): ``cu_seqlens`` ``(S + 1,)`` token offsets (``cu_seqlens[0]`` may be
    > 0: tokens before the first segment, e.g. decoding rows, are not touched); ``read``, ``write``,
    ``snap``, ``snap_at`` ``(S,)`` entries and snapshot boundaries (tokens from the segment's start;
    0 = no snapshot, then ``snap[s]`` is ignored); ``chunks`` ``(M, 2)``: each chunk's segment and
    first token; ``chunk_offsets`` ``(S + 1,)``: segment ``s``'s chunks are ``chunk_offsets[s] ..
    chunk_offsets[s+1] - 1`` of ``chunks``.
    Host: ``offsets`` (= ``cu_seqlens``) and ``snap_tokens`` (= ``snap_at``).
    """

    cu_seqlens: torch.Tensor
    read: torch.Tensor
    write: torch.Tensor
    snap: torch.Tensor
    snap_at: torch.Tensor
    chunks: torch.Tensor
    chunk_offsets: torch.Tensor
    offsets: tuple[int, ...]
    snap_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        count = len(self.offsets) - 1
        if count < 0 or len(self.snap_tokens) != count:
            raise ValueError(f"{len(self.offsets)} offsets and {len(self.snap_tokens)} snapshot boundaries "
                             "do not describe one list of segments")
        if self.offsets[0] < 0 or any(b <= a for a, b in zip(self.offsets, self.offsets[1:], strict=False)):
            raise ValueError(f"segment offsets {self.offsets} must start >= 0 and grow (every segment >= 1 token)")
        for s, (n, at) in enumerate(zip(self.lengths, self.snap_tokens, strict=True)):
            if at and (at % CHUNK or not 0 < at <= n):
                raise ValueError(f"segment {s}: snapshot after {at} of its {n} tokens is not a {CHUNK}-token "
                                 "chunk boundary inside it")
        shapes = {"cu_seqlens": (count + 1,), "read": (count,), "write": (count,), "snap": (count,),
                  "snap_at": (count,), "chunks": (self.chunk_count, 2), "chunk_offsets": (count + 1,)}
        device = self.cu_seqlens.device
        for name, shape in shapes.items():
            tensor = getattr(self, name)
            if tensor.dtype != torch.int32 or tuple(tensor.shape) != shape or tensor.device != device:
                raise ValueError(f"PackedSegments.{name}: expected int32 {shape} on {device}, got "
                                 f"{tensor.dtype} {tuple(tensor.shape)} on {tensor.device}")
            if not tensor.is_contiguous():
                raise ValueError(f"PackedSegments.{name} must be contiguous")

    @property
    def count(self) -> int:
        """``S``: the number of segments."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> tuple[int, ...]:
        """Each segment's tokens."""
        return tuple(b - a for a, b in zip(self.offsets, self.offsets[1:], strict=False))

    @property
    def chunk_count(self) -> int:
        """``M``: the chunks of every segment (each segment's last one partial)."""
        return sum(-(-n // CHUNK) for n in self.lengths)

    @property
    def longest(self) -> int:
        """The longest segment's tokens (0 without segments)."""
        return max(self.lengths, default=0)

    @classmethod
    def build(cls, lengths: Sequence[int], read: Sequence[int], write: Sequence[int], device: torch.device,
              snap: Sequence[int] | None = None, snap_at: Sequence[int] | None = None,
              first_token: int = 0) -> PackedSegments:
        """Segments of ``lengths`` tokens one after another from token ``first_token``, reading entries
        ``read`` and writing ``write``; ``snap``/``snap_at`` (default none) the snapshots. Checks the
        entry rules (module docstring) on the host, then copies one pinned int32 buffer to ``device``
        without waiting for the steps already queued."""
        count = len(lengths)
        snap = list(snap) if snap is not None else [ZERO_ENTRY] * count
        snap_at = list(snap_at) if snap_at is not None else [0] * count
        if not len(read) == len(write) == len(snap) == len(snap_at) == count:
            raise ValueError(f"{count} segments need {count} read, write, snap and snap_at entries each")
        snapped = [e for e, at in zip(snap, snap_at, strict=True) if at]
        written = [*write, *snapped]
        if min((*read, *written), default=0) < 0:
            raise ValueError("pool entries are >= 0")
        if ZERO_ENTRY in written:
            raise ValueError(f"entry {ZERO_ENTRY} is the permanent zero state: never written")
        if len(set(written)) != len(written) or set(written) & set(read):
            raise ValueError(f"a step writes each entry at most once and never one it reads: read {list(read)}, "
                             f"write {list(write)}, snapshots {snapped}")
        offsets = [first_token]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        chunks: list[int] = []
        chunk_offsets = [0]
        for s, n in enumerate(lengths):
            for start in range(offsets[s], offsets[s] + n, CHUNK):
                chunks += [s, start]
            chunk_offsets.append(len(chunks) // 2)
        # NOTE: each field starts 16 bytes into the buffer's alignment: Triton specializes a kernel on
        # each pointer's alignment, so views at offsets that vary with the segment count would compile
        # variants warm-up cannot enumerate (kernels/kernel_variants.py)
        fields = (offsets, read, write, snap, snap_at, chunk_offsets, chunks)
        values: list[int] = []
        starts = []
        for values_of in fields:
            starts.append(len(values))
            values += [*values_of, *[0] * (-len(values_of) % ALIGN_VALUES)]
        host = torch.tensor(values, dtype=torch.int32)
        if device.type == "cuda":
            host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
        flat = host.to(device, non_blocking=True)
        views = [flat[at : at + len(values_of)] for at, values_of in zip(starts, fields, strict=True)]
        return cls(views[0], views[1], views[2], views[3], views[4], views[6].view(-1, 2), views[5],
                   tuple(offsets), tuple(snap_at))
