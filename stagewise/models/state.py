"""Per-block sequence state: KV caches and double-buffered recurrent state.

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

from stagewise.models.block_table import BlockTable


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


class KVCache:
    """Keys and values of one attention block, paged: ``(pool_blocks, kv_heads, block_tokens, head_dim)``
    each, addressed through the stage's shared :class:`BlockTable` (position ``p`` of row ``r`` in block
    ``table[r, p // block_tokens]``, offset ``p % block_tokens``)."""

    def __init__(self, table: BlockTable, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (table.pool_blocks, kv_heads, table.block_tokens, head_dim)
        self.key = torch.zeros(shape, dtype=dtype, device=device)
        self.value = torch.zeros(shape, dtype=dtype, device=device)
        self.table = table

    def write(self, positions: torch.Tensor, key: torch.Tensor, value: torch.Tensor, start: int | None,
              rows: slice | torch.Tensor) -> None:
        """Store ``key``/``value`` ``(B, kvH, T, D)`` of ``rows`` (a span, or each batch row's state row
        ``(B,)``) at ``positions`` ``(B, T)``, through the table
        (``start``, the common first position when there is one, is not needed: every write scatters)."""
        blocks, offsets = self.table.slots(positions, rows)  # (B, T) each
        self.key[blocks, :, offsets] = key.transpose(1, 2)  # (B, T, kvH, D)
        self.value[blocks, :, offsets] = value.transpose(1, 2)

    def view(self, rows: slice | torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``rows``' (a span, or state rows ``(B,)``) first ``length`` positions, gathered from their blocks:
        ``(B, kvH, length, D)`` (a copy, laid out as a dense per-row cache would be)."""
        blocks = self.table.row_blocks(rows, length)  # (B, nb)
        return self._gather(self.key, blocks, length), self._gather(self.value, blocks, length)

    @staticmethod
    def _gather(pool: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
        batch, nb = blocks.shape
        _, kv_heads, block_tokens, dim = pool.shape
        # one copy: gather along the block dim of a head-major view, so each head's positions come out
        # consecutive; the result is (B, kvH, L, D) with D and L contiguous (batch and head strides swapped)
        if pool.device.type == "cpu":
            # NOTE: on the CPU, index_select along a non-leading dim of a transposed view first copies the
            # whole pool (its cost grew with --max-seqs, not with the positions attended); gathering
            # whole blocks along the pool's leading dim reads only the blocks named, then one more copy
            # of them lays the heads out first (same values, same (B, kvH, L, D) shape)
            paged = pool.index_select(0, blocks.reshape(-1)).view(batch, nb, kv_heads, block_tokens, dim)
            heads_first = paged.transpose(1, 2).reshape(batch, kv_heads, nb * block_tokens, dim)
            return heads_first[:, :, :length]
        heads_first = pool.transpose(0, 1)  # (kvH, blocks, bt, D) view
        paged = heads_first.index_select(1, blocks.reshape(-1))  # (kvH, B*nb, bt, D)
        return paged.view(kv_heads, batch, nb * block_tokens, dim).transpose(0, 1)[:, :, :length]

    def move(self, src: int, dst: int, length: int) -> None:
        pass  # the stage moves the block-table row: the keys and values stay where they are

    def publish(self, rows: slice | None = None) -> None:
        pass  # acceptance is the pipeline's position bookkeeping

    def rollback(self, rows: slice | None = None) -> None:
        pass  # provisional positions are masked until accepted

    def reset(self, slot: int) -> None:
        pass  # a new sequence writes from position 0; the causal mask hides the rest

    @property
    def nbytes(self) -> int:
        return 2 * self.key.numel() * self.key.element_size()  # key + value

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every row's keys and values read through the table: ``(rows, kvH, blocks_per_row · bt, D)``."""
        everything = slice(0, self.table.rows)
        length = self.table.blocks_per_row * self.table.block_tokens
        key, value = self.view(everything, length)
        return {"key": key, "value": value}


class RecurrentState:
    """Double-buffered fixed-size state: named tensors, each stored as ``(2, rows, *shape)``, with a
    published buffer per row (``parity``)."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> None:
        self.buffers = {name: torch.zeros((2, *shape), dtype=dtype, device=device)
                        for name, (shape, dtype) in shapes.items()}
        rows = {shape[0] for shape, _ in shapes.values()}
        assert len(rows) == 1, "every tensor of a recurrent state has one row per sequence"
        self.parity = [0] * rows.pop()  # per row: the index of its published buffer
        self._written: list[slice] = []  # rows written provisionally, one slice per step not yet settled

    def active(self, rows: slice) -> int:
        """The published buffer of ``rows`` (they must share it)."""
        first, *rest = set(self.parity[rows])
        if rest:
            raise RuntimeError(f"rows {rows.start}..{rows.stop - 1} of one step have different published buffers")
        return first

    def read(self, name: str, rows: slice) -> torch.Tensor:
        """The published value of ``rows`` (do not modify in place)."""
        return self.buffers[name][self.active(rows)][rows]

    def write(self, name: str, value: torch.Tensor, rows: slice) -> None:
        """Write the provisional value of ``rows`` for this step."""
        self.provisional(name, rows).copy_(value)

    def provisional(self, name: str, rows: slice) -> torch.Tensor:
        """The provisional buffer of ``rows``, for a kernel to write in place (marks them written)."""
        self.mark_written(rows)
        return self.buffers[name][1 - self.active(rows)][rows]

    def mark_written(self, rows: slice) -> None:
        """``rows``' provisional buffer is (being) written by a step (a replayed CUDA graph: no Python ran
        to note it). A row written by another step not yet settled is a bug: :class:`RuntimeError`."""
        if rows in self._written:
            return  # another tensor of the same step
        span = range(*rows.indices(len(self.parity)))
        for other in self._written:
            if rows_overlap(span, range(*other.indices(len(self.parity)))):
                raise RuntimeError(f"rows {rows.start}..{rows.stop - 1} written while a step over rows "
                                   f"{other.start}..{other.stop - 1} is not settled")
        self._written.append(rows)

    def _settle(self, rows: slice | None) -> list[slice]:
        """Remove and return the provisional writes to ``rows`` (all of them when None)."""
        if rows is None:
            settled, self._written = self._written, []
            return settled
        settled = [w for w in self._written if w == rows]
        self._written = [w for w in self._written if w != rows]
        return settled

    def publish(self, rows: slice | None = None) -> None:
        for written in self._settle(rows):
            for row in range(*written.indices(len(self.parity))):
                self.parity[row] = 1 - self.parity[row]

    def rollback(self, rows: slice | None = None) -> None:
        self._settle(rows)

    def move(self, src: int, dst: int, length: int) -> None:
        if src == dst:
            return
        for buf in self.buffers.values():
            buf[self.parity[dst], dst].copy_(buf[self.parity[src], src])

    def align(self, rows: slice, parity: int) -> None:
        """Make ``parity`` the published buffer of every row of ``rows`` (copying where it is not)."""
        for row in range(*rows.indices(len(self.parity))):
            if self.parity[row] != parity:
                for buf in self.buffers.values():
                    buf[parity, row].copy_(buf[1 - parity, row])
                self.parity[row] = parity

    def reset(self, slot: int) -> None:
        for buf in self.buffers.values():
            buf[:, slot].zero_()
        self.parity[slot] = 0

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Published contents, row by row."""
        return {name: torch.stack([buf[p, row] for row, p in enumerate(self.parity)])
                for name, buf in self.buffers.items()}
