"""RecurrentState: one linear-attention block's fixed-size state, as pools of entries.

Each named tensor (Gated DeltaNet: ``conv`` and ``recurrent``) is a pool ``(entries, *shape)``;
which entry a row reads and which it writes is its stage's :class:`StateSlots` table, shared by
every such block of the stage. Publishing and rolling back a step are the table's (one per stage),
as are resets and row moves: this object never copies state between entries.
"""

from __future__ import annotations

import torch

from stagewise.models.state_slots import StateSlots


class RecurrentState:
    """Pools ``(slots.entries, *shape)`` of each named ``shape`` / dtype, addressed through ``slots``."""

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], slots: StateSlots,
                 device: torch.device) -> None:
        self.slots = slots
        self.pools = {name: torch.zeros((slots.entries, *shape), dtype=dtype, device=device)
                      for name, (shape, dtype) in shapes.items()}

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.pools.values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every row's published state ``(rows, *shape)`` (a copy), in row order."""
        index = torch.tensor(self.slots.published_entries(), dtype=torch.long, device=self.slots.table.device)
        return {name: pool.index_select(0, index) for name, pool in self.pools.items()}
