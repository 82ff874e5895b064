"""StageStates: every block's state of one stage, with the stage's two tables.

The blocks' states by global block index (a mapping), the :class:`BlockTable` their KV pools share
and, where a block keeps recurrent state, the :class:`StateSlots` those blocks share. Row operations
and step settlement are the tables': a step's rows are begun before it runs, then published or
rolled back; a new sequence's row is reset; rows move (compaction) by rewriting both tables. No
operation here copies any block's state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from stagewise.models.block_table import BlockTable
from stagewise.models.state import BlockState
from stagewise.models.state_slots import StateSlots


class StageStates(Mapping[int, BlockState]):
    """``blocks`` by global index over ``block_table`` (KV) and ``slots`` (recurrent, or None)."""

    def __init__(self, blocks: dict[int, BlockState], block_table: BlockTable, slots: StateSlots | None) -> None:
        self.blocks = blocks
        self.block_table = block_table
        self.slots = slots

    def __getitem__(self, index: int) -> BlockState:
        return self.blocks[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.blocks.values())

    def begin(self, rows: Iterable[int]) -> None:
        """A step is about to write ``rows`` provisionally (see :meth:`StateSlots.begin`)."""
        if self.slots is not None:
            self.slots.begin(rows)

    def publish(self, rows: Iterable[int] | None = None) -> None:
        """Accept the step that ran ``rows`` (every unsettled step: None). KV needs nothing: the
        pipeline's positions accept it."""
        if self.slots is not None:
            self.slots.publish(rows)

    def rollback(self, rows: Iterable[int] | None = None) -> None:
        """Discard the step that ran ``rows`` (every unsettled step: None)."""
        if self.slots is not None:
            self.slots.rollback(rows)

    def reset(self, row: int) -> None:
        """A new sequence starts in ``row`` (its recurrent state reads zeros; its KV is written from 0)."""
        if self.slots is not None:
            self.slots.reset(row)

    def move(self, src: int, dst: int) -> None:
        """Row ``dst`` takes row ``src``'s KV blocks and recurrent entries; ``src`` is left with no blocks."""
        self.block_table.move(src, dst)
        if self.slots is not None:
            self.slots.move(src, dst)
