"""Per-block sequence state: the protocol every block's state keeps (KV caches: kv_cache.py; recurrent
state: recurrent_state.py).

State is held in rows (sequence slots): a step runs a contiguous range of rows (``rows``, a
``slice``), and rows outside it are never read or written. State updates are explicit and
transactional. A step writes *provisionally*:
- a :class:`KVCache` writes keys/values at the step's absolute positions (through the stage's
  block table, :mod:`stagewise.models.block_table`); positions past a
  sequence's accepted length are ignored by the causal mask until the pipeline accepts them, so
  rollback needs no copy;
- a :class:`RecurrentState` keeps two buffers and, per row, which one is published (its parity);
  a step reads its rows' published buffer and writes the other one; :meth:`RecurrentState.publish`
  flips the written rows' parity, :meth:`RecurrentState.rollback` discards the write. Rows of one
  step share a parity (the engine keeps a batch's rows in step and aligns rows that join it).
  Steps over disjoint rows may be provisional at once (pipelined micro-batches in worker
  processes): ``publish(rows)`` / ``rollback(rows)`` settle the writes of the step that ran ``rows``
  only; without ``rows`` they settle every provisional write.
Nothing is hidden in module attributes: blocks receive their state as an argument.
"""

from __future__ import annotations

from typing import Protocol

import torch


def rows_overlap(a: slice | range, b: slice | range) -> bool:
    """Whether two spans of state rows (explicit bounds, step 1) share a row."""
    return a.start < b.stop and b.start < a.stop


class BlockState(Protocol):
    """What the pipeline needs from any block's state."""

    def publish(self, rows: slice | None = None) -> None:
        """Accept the provisional writes to ``rows`` (every provisional write when None)."""
        ...

    def rollback(self, rows: slice | None = None) -> None:
        """Discard the provisional writes to ``rows`` (every provisional write when None)."""
        ...

    def reset(self, slot: int) -> None:
        """Forget sequence ``slot`` (a new request starts there)."""
        ...

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src``'s published state (its first ``length`` positions) into row ``dst``."""
        ...

    @property
    def nbytes(self) -> int: ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """Published contents, for equality checks and tests."""
        ...
