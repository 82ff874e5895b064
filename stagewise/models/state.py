"""Per-block sequence state: the protocol every block's state keeps.

State is held in rows (sequence slots), each block's in its own kind of store: a :class:`KVCache`
(kv_cache.py) keeps keys and values in block pools through the stage's :class:`BlockTable`; a
:class:`RecurrentState` (recurrent_state.py) keeps fixed-size state in entry pools through the
stage's :class:`StateSlots`. Both tables are the stage's, one each, shared by its blocks, and every
state update is explicit and transactional there. A step writes *provisionally*:
- keys and values at the step's absolute positions; positions past a sequence's accepted length
  are ignored by the causal mask until the pipeline accepts them, so rollback needs no copy;
- recurrent state into each row's write entry; publishing makes it the row's read entry, rolling
  back forgets it (:class:`StateSlots`).
Steps over disjoint rows may be provisional at once (pipelined micro-batches in worker processes),
each settled for the rows it ran. Nothing is hidden in module attributes: blocks receive their
state as an argument.
"""

from __future__ import annotations

from typing import Protocol

import torch


def rows_overlap(a: slice | range, b: slice | range) -> bool:
    """Whether two spans of state rows (explicit bounds, step 1) share a row."""
    return a.start < b.stop and b.start < a.stop


class BlockState(Protocol):
    """What the stage needs from any block's state (its tables settle, reset and move rows)."""

    @property
    def nbytes(self) -> int: ...

    def tensors(self) -> dict[str, torch.Tensor]:
        """Published contents, for equality checks and tests."""
        ...
