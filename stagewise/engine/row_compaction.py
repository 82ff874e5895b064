"""Row compaction: closing the holes finished sequences leave in the decoding rows, as a plan of moves
(host integers only; the runner applies the moves to every stage's state rows)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RowMove:
    """Move the state of row ``src`` (``length`` positions) to row ``dst``."""

    src: int
    dst: int
    length: int

    def __post_init__(self) -> None:
        if self.src < 0 or self.dst < 0 or self.length < 0:
            raise ValueError(f"a row move needs rows and a length >= 0, got {self}")


@dataclass(frozen=True)
class Compaction:
    """The decoding rows closed up: ``moves`` in order (each sequence moves at most once, last live row
    into the lowest hole) and ``rows``, the live rows' sequences' former indices in their new order."""

    moves: tuple[RowMove, ...]
    rows: tuple[int, ...]


def plan_compaction(lengths: list[int | None]) -> Compaction:
    """Close the holes of the decoding rows; ``lengths[i]``: row ``i``'s positions (None: a hole)."""
    rows = list(range(len(lengths)))
    live = [n is not None for n in lengths]
    while rows and not live[rows[-1]]:
        rows.pop()
    moves: list[RowMove] = []
    for hole in range(len(rows)):
        if hole >= len(rows):
            break
        if not live[rows[hole]]:
            src = rows.pop()
            length = lengths[src]
            assert length is not None
            moves.append(RowMove(src, hole, length))
            rows[hole] = src
            while rows and not live[rows[-1]]:
                rows.pop()
    return Compaction(tuple(moves), tuple(rows))
