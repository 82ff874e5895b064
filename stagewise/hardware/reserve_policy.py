"""ReservePolicy: how much of a device's free memory is kept back from the model.

Default (documented in docs/accounting.md): GPUs keep ``max(1 GiB, 6% of total)`` for the
CUDA context, cuBLAS workspaces, allocator fragmentation and the desktop; CPU devices keep
``max(2 GiB, 10% of total)`` for the OS and the Python process; other kinds keep
``max(1 GiB, 6%)``. ``--reserve`` overrides: ``2GiB`` (every kind), ``8%``, or per kind
``cuda=1.5GiB,cpu=20%``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stagewise.errors import TopologyError
from stagewise.hardware.sizes import parse_bytes


@dataclass(frozen=True)
class Reserve:
    """Keep back ``max(fixed_bytes, fraction * total)``."""

    fixed_bytes: int = 0
    fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.fixed_bytes < 0 or not 0.0 <= self.fraction < 1.0:
            raise TopologyError(f"reserve: need fixed_bytes >= 0 and 0 <= fraction < 1, got {self}")

    def bytes_for(self, total_bytes: int) -> int:
        return max(self.fixed_bytes, int(self.fraction * total_bytes))


_DEFAULTS: dict[str, Reserve] = {
    "cuda": Reserve(1 << 30, 0.06),
    "cpu": Reserve(2 << 30, 0.10),
}
_OTHER = Reserve(1 << 30, 0.06)


@dataclass(frozen=True)
class ReservePolicy:
    """Per device kind reserve; kinds not named fall back to ``default``."""

    by_kind: dict[str, Reserve] = field(default_factory=lambda: dict(_DEFAULTS))
    default: Reserve = _OTHER

    def reserve_bytes(self, kind: str, total_bytes: int) -> int:
        return self.by_kind.get(kind, self.default).bytes_for(total_bytes)

    def budget_bytes(self, kind: str, total_bytes: int, free_bytes: int | None = None) -> int:
        """Budget = free memory (total when unknown) minus this kind's reserve, floored at 0."""
        free = total_bytes if free_bytes is None else free_bytes
        return max(0, min(free, total_bytes) - self.reserve_bytes(kind, total_bytes))

    @staticmethod
    def parse(text: str | None) -> ReservePolicy:
        """Parse ``--reserve``: ``2GiB`` | ``8%`` | ``cuda=1GiB,cpu=20%``; None -> defaults."""
        if not text:
            return ReservePolicy()
        by_kind = dict(_DEFAULTS)
        default = _OTHER
        for part in text.split(","):
            kind, sep, value = part.strip().rpartition("=")
            reserve = _parse_one(value.strip())
            if sep:
                by_kind[kind.strip()] = reserve
            else:
                by_kind = {}
                default = reserve
        return ReservePolicy(by_kind, default)


def _parse_one(value: str) -> Reserve:
    if value.endswith("%"):
        try:
            pct = float(value[:-1])
        except ValueError:
            raise TopologyError(f"--reserve: cannot read percentage {value!r}") from None
        if not 0 <= pct < 100:
            raise TopologyError(f"--reserve: percentage must be in [0, 100), got {value!r}")
        return Reserve(0, pct / 100.0)
    return Reserve(parse_bytes(value, "--reserve"), 0.0)
