"""StateSlots: where each row's recurrent state lives in its stage's entry pools.

Every linear-attention block of a stage keeps its conv and recurrent state as pools of *entries*
(:class:`~stagewise.models.recurrent_state.RecurrentState`); one table per stage, shared by those
blocks, says which entry each state row reads and which it writes: ``table`` ``(rows, 2)`` int32 on
the stage's device, ``[read entry, write entry]`` per row. Kernels take entry indices (read and write
buffers chosen per row by index), so no step needs its rows to agree on anything, and joining,
leaving, preemption and compaction copy no state: they rewrite the table, like a KV block table.

Entries: ``0`` is the zero entry, never written (a fresh sequence reads it: the reference's zero
initial state); each row owns two more (published and provisional, a step never reads and writes
the same entry); past those, ``snapshots`` entries the prefix cache fills and a restored sequence
reads. A step writes its rows' write entries *provisionally*; :meth:`publish` makes them the rows'
read entries, :meth:`rollback` forgets them. Steps over disjoint rows may be provisional at once
(pipelined micro-batches in worker processes), each settled for the rows it ran.

The table tensor has a static address (CUDA graphs read it) and is only updated in place, in
stream order with the steps (from pinned host memory, no host sync); the host keeps the truth.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

ZERO_ENTRY = 0  # all zeros, never written: what a fresh sequence reads


def entries_for(rows: int, snapshots: int = 0) -> int:
    """Entries a pool holds for ``rows`` rows and ``snapshots`` prefix snapshots: the zero entry, two
    per row (published + provisional) and the snapshots."""
    return 1 + 2 * rows + snapshots  # zero entry + (published + provisional) per row + snapshots


class StateSlots:
    """The read/write entries of ``rows`` state rows over pools of :func:`entries_for` entries."""

    def __init__(self, rows: int, device: torch.device, snapshots: int = 0) -> None:
        if rows < 1 or snapshots < 0:
            raise ValueError(f"state slots need at least one row and no negative snapshots, got {rows}, {snapshots}")
        self.rows = rows
        self.snapshots = snapshots
        self.entries = entries_for(rows, snapshots)
        self.device = device
        self._own = [(1 + 2 * r, 2 + 2 * r) for r in range(rows)]  # each row's two entries
        self._parity = [0] * rows  # which of its own entries a row has published
        self._source: list[int | None] = [ZERO_ENTRY] * rows  # read this instead (fresh, or a snapshot)
        self._written: list[frozenset[int]] = []  # the rows of each step not yet settled
        self.table = torch.zeros((rows, 2), dtype=torch.int32, device=device)  # (rows, [read, write])
        self._push(range(rows))

    @property
    def first_snapshot(self) -> int:
        """The first snapshot entry (the snapshots are ``first_snapshot ..``)."""
        return 1 + 2 * self.rows

    def read_entry(self, row: int) -> int:
        """The entry ``row``'s next step reads: its published state."""
        source = self._source[row]
        return source if source is not None else self._own[row][self._parity[row]]

    def write_entry(self, row: int) -> int:
        """The entry ``row``'s next step writes (provisionally)."""
        return self._own[row][1 - self._parity[row]] if self._source[row] is None else self._own[row][self._parity[row]]

    def begin(self, rows: Iterable[int]) -> None:
        """A step is about to write ``rows`` provisionally (it reads the table as it is now). A row
        written by another step not yet settled is a bug: :class:`RuntimeError`."""
        step = frozenset(rows)
        if step in self._written:
            return  # the same step's other stage pass (a graph replay after an eager run)
        for other in self._written:
            if step & other:
                raise RuntimeError(f"rows {sorted(step & other)} written while another step over them is not settled")
        self._written.append(step)

    def _settle(self, rows: Iterable[int] | None) -> list[frozenset[int]]:
        if rows is None:
            settled, self._written = self._written, []
            return settled
        step = frozenset(rows)
        settled = [w for w in self._written if w == step]
        self._written = [w for w in self._written if w != step]
        return settled

    def publish(self, rows: Iterable[int] | None = None) -> None:
        """Accept the provisional writes of the step that ran ``rows`` (every unsettled step: None):
        each row's write entry becomes its read entry."""
        changed: list[int] = []
        for step in self._settle(rows):
            for row in step:
                if self._source[row] is None:
                    self._parity[row] = 1 - self._parity[row]
                else:  # it read a shared entry (zero or a snapshot) and wrote its own published-to-be one
                    self._source[row] = None
                changed.append(row)
        self._push(changed)

    def rollback(self, rows: Iterable[int] | None = None) -> None:
        """Discard the provisional writes of the step that ran ``rows`` (every unsettled step: None)."""
        self._settle(rows)

    def reset(self, row: int) -> None:
        """A new sequence starts in ``row``: it reads the zero entry."""
        self.restore(row, ZERO_ENTRY)

    def restore(self, row: int, entry: int) -> None:
        """``row``'s next step reads ``entry`` (the zero entry or a snapshot), not its own state."""
        if entry != ZERO_ENTRY and not self.first_snapshot <= entry < self.entries:
            raise ValueError(f"entry {entry} is neither the zero entry nor a snapshot ({self.first_snapshot}..{self.entries - 1})")
        self._source[row] = entry
        self._push([row])

    def move(self, src: int, dst: int) -> None:
        """Row ``dst`` takes row ``src``'s state (its entries); ``src`` takes ``dst``'s. No copy."""
        if src == dst:
            return
        self._own[src], self._own[dst] = self._own[dst], self._own[src]
        self._parity[src], self._parity[dst] = self._parity[dst], self._parity[src]
        self._source[src], self._source[dst] = self._source[dst], self._source[src]
        self._push([src, dst])

    def published_entries(self) -> list[int]:
        """Every row's read entry (tests and state reads)."""
        return [self.read_entry(r) for r in range(self.rows)]

    def _push(self, rows: Iterable[int]) -> None:
        """Copy ``rows``' host entries into the device table, in stream order."""
        rows = sorted(set(rows))
        if not rows or self.device.type == "meta":
            return
        host = torch.tensor([[self.read_entry(r), self.write_entry(r)] for r in rows], dtype=torch.int32)
        if self.device.type == "cuda":
            host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
        if len(rows) == rows[-1] - rows[0] + 1:
            self.table[rows[0] : rows[-1] + 1].copy_(host, non_blocking=True)
        else:
            index = torch.tensor(rows, dtype=torch.long)
            if self.device.type == "cuda":
                index = index.pin_memory()
            self.table.index_copy_(0, index.to(self.device, non_blocking=True), host.to(self.device, non_blocking=True))
