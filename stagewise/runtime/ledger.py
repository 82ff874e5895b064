"""MemoryLedger: every byte a stage allocates is charged here first, against its budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from stagewise.errors import StageOutOfMemory

CATEGORIES = ("weights", "state", "workspace")


@dataclass
class MemoryLedger:
    """Charges by category for one stage; a charge past ``budget_bytes`` raises before allocating."""

    device: str
    budget_bytes: int
    charged: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    @property
    def total_bytes(self) -> int:
        return sum(self.charged.values())

    def charge(self, category: str, nbytes: int, what: str) -> None:
        """Reserve ``nbytes`` for ``what``; raise :class:`StageOutOfMemory` if it would pass the budget."""
        if category not in self.charged:
            raise ValueError(f"unknown ledger category {category!r}")
        if self.total_bytes + nbytes > self.budget_bytes:
            raise StageOutOfMemory(
                f"{self.device}: allocating {what} ({nbytes / 2**20:.1f} MiB) would exceed the stage budget "
                f"({self.total_bytes / 2**20:.1f} of {self.budget_bytes / 2**20:.1f} MiB already charged)"
            )
        self.charged[category] += nbytes

    def release(self, category: str, nbytes: int) -> None:
        self.charged[category] = max(0, self.charged[category] - nbytes)
