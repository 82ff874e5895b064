"""StepLayout: a packed step — runs of consecutive positions of several state rows in one token column.

A packed step (chunked prefill mixed with decode, vLLM's ``max_num_batched_tokens`` step) carries
``N`` tokens as a ``(N, 1)`` batch: segment ``s`` is ``lengths[s]`` tokens of state row ``rows[s]`` at
positions ``starts[s] ..``, the segments one after another. Every layer that works token by token
(embedding, projections, MLP, MoE, norms) runs the column as it would any batch; attention writes
each token's key and value into its row's KV blocks and attends each token over its own row up to
its position (:meth:`Attention.forward`); a linear-attention block runs each segment from its row's
state entries (:class:`~stagewise.models.layers.gated_deltanet.GatedDeltaNet`). No token is padding,
so no row's state sees a token it does not own.

``decoding``: the first segments are decoding rows, one token each: attention runs them as one
decode batch, and each later segment (a prompt's chunk) on its own. ``logits``: the segments whose
last token's logits the exit computes (in that order): a decoding row's, and a prompt's whose last
chunk this is. ``snapshots``: ``(segment, tokens, entry)``: the recurrent state of a prompt segment
after its first ``tokens`` tokens (a block boundary) is also written to state entry ``entry`` (a
prefix snapshot, :class:`~stagewise.models.state_slots.StateSlots`). Host-side integers only:
building one never synchronizes a device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepLayout:
    """Segments ``(rows[s], starts[s], lengths[s])`` in token order, the first ``decoding`` of them
    decoding rows; ``logits`` segment indices."""

    rows: tuple[int, ...]
    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    logits: tuple[int, ...] = ()
    decoding: int = 0
    snapshots: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.rows or not len(self.rows) == len(self.starts) == len(self.lengths):
            raise ValueError("a packed step needs one row, start and length per segment, and a segment")
        if min(self.lengths) < 1 or min(self.starts) < 0 or min(self.rows) < 0:
            raise ValueError("segments need at least one token, positions and rows >= 0")
        if len(set(self.rows)) != len(self.rows):
            raise ValueError("a packed step holds at most one segment of each row")
        if not 0 <= self.decoding <= len(self.rows) or any(n != 1 for n in self.lengths[: self.decoding]):
            raise ValueError("the decoding segments are one token each, and at most every segment")
        if any(not 0 <= s < len(self.rows) for s in self.logits) or len(set(self.logits)) != len(self.logits):
            raise ValueError("logits name distinct segments of the step")
        segments = [s for s, _, _ in self.snapshots]
        if len(set(segments)) != len(segments) or len({e for _, _, e in self.snapshots}) != len(segments):
            raise ValueError("a snapshot names its own segment and entry")
        if any(not self.decoding <= s < len(self.rows) or not 0 < n <= self.lengths[s] or e < 1
               for s, n, e in self.snapshots):
            raise ValueError("snapshots name prompt segments, a point inside them and a state entry")

    @property
    def tokens(self) -> int:
        """``N``: the step's tokens, every segment's."""
        return sum(self.lengths)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Each segment's first token index in the column (and ``N`` last)."""
        out = [0]
        for n in self.lengths:
            out.append(out[-1] + n)
        return tuple(out)

    @property
    def kv_end(self) -> int:
        """One past the last position any segment writes: the keys the step attends to."""
        return max(start + n for start, n in zip(self.starts, self.lengths, strict=True))

    def token_rows(self) -> list[int]:
        """The state row of every token, in order (``N`` entries)."""
        return [row for row, n in zip(self.rows, self.lengths, strict=True) for _ in range(n)]

    def positions(self) -> list[int]:
        """The position of every token, in order (``N`` entries)."""
        return [start + i for start, n in zip(self.starts, self.lengths, strict=True) for i in range(n)]

    def logit_tokens(self) -> list[int]:
        """Token indices of the last token of each segment in :attr:`logits`."""
        ends = self.offsets[1:]
        return [ends[s] - 1 for s in self.logits]
