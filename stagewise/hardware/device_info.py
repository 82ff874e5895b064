"""DeviceInfo: one device a stage can live on, with its memory budget and speeds."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stagewise.errors import TopologyError
from stagewise.hardware.sizes import checked_bytes

DEVICE_KINDS = frozenset({"cuda", "cpu", "mps", "xpu", "sim"})


def split_device_id(device_id: str) -> tuple[str, int]:
    """``"cuda:1"`` -> ``("cuda", 1)``; raise :class:`TopologyError` for anything else."""
    kind, sep, index = device_id.partition(":")
    if not sep or kind not in DEVICE_KINDS or not index.isdigit():
        raise TopologyError(f"device id {device_id!r} must look like KIND:INDEX with KIND in {sorted(DEVICE_KINDS)}")
    return kind, int(index)


@dataclass(frozen=True)
class DeviceInfo:
    """A device that may hold one stage.

    ``budget_bytes`` is what one model may use on it (free memory minus the reserve, or a user
    cap). ``torch_device`` is the torch device string the executor runs it on (``"cpu"`` for
    every virtual CPU device); it is empty for simulated devices, which only plan.
    """

    id: str
    host: str
    kind: str
    name: str
    memory_bytes: int
    budget_bytes: int
    memory_bandwidth_bytes_per_s: float
    matmul_flops_per_s: float
    torch_device: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    free_bytes: int | None = None
    measured: bool = False

    def __post_init__(self) -> None:
        kind, _ = split_device_id(self.id)
        if kind != self.kind:
            raise TopologyError(f"device {self.id}: kind {self.kind!r} does not match its id")
        checked_bytes(self.memory_bytes, f"device {self.id}: memory_bytes")
        checked_bytes(self.budget_bytes, f"device {self.id}: budget_bytes")
        if self.budget_bytes > self.memory_bytes:
            raise TopologyError(
                f"device {self.id}: budget_bytes {self.budget_bytes} exceeds memory_bytes {self.memory_bytes}"
            )
        for field in ("memory_bandwidth_bytes_per_s", "matmul_flops_per_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e18:
                raise TopologyError(f"device {self.id}: {field} must be a positive number, got {value!r}")
        if not self.host:
            raise TopologyError(f"device {self.id}: host must not be empty")

    @property
    def index(self) -> int:
        return split_device_id(self.id)[1]

    @property
    def executable(self) -> bool:
        """False for simulated devices: they exist only for planning."""
        return bool(self.torch_device)

    @property
    def sort_key(self) -> tuple[str, str, int]:
        """Canonical order: host, then PCI bus id (empty sorts first), then kind and index."""
        return (self.host, self.pci_bus_id or f"{self.kind}:{self.index:06d}", self.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
