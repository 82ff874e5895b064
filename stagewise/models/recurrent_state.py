"""RecurrentState: one linear-attention block's fixed-size state per sequence row, double-buffered."""

from __future__ import annotations

import torch

from stagewise.models.state import rows_overlap


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
