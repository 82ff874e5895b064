"""Link: how a hidden activation travels from one device to another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagewise.errors import TopologyError

LINK_KINDS = ("same-device", "nvlink", "pcie-p2p", "pcie-host-staged", "network")


@dataclass(frozen=True)
class Link:
    """An undirected link between devices ``a`` and ``b`` (ids)."""

    a: str
    b: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    peer_access: bool = False
    nvlink_count: int = 0
    measured: bool = False

    def __post_init__(self) -> None:
        where = f"link {self.a}-{self.b}"
        if self.kind not in LINK_KINDS:
            raise TopologyError(f"{where}: kind {self.kind!r} must be one of {', '.join(LINK_KINDS)}")
        bw = self.bandwidth_bytes_per_s
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < 1e16:
            raise TopologyError(f"{where}: bandwidth must be a positive number of bytes/s, got {bw!r}")
        lat = self.latency_s
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not 0 <= lat < 10:
            raise TopologyError(f"{where}: latency_s must be in [0, 10) seconds, got {lat!r}")
        if self.a == self.b and self.kind != "same-device":
            raise TopologyError(f"{where}: a device's link to itself must be same-device")

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b) if self.a <= self.b else (self.b, self.a)

    def transfer_s(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` across the link: latency + bytes / bandwidth."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "between": [self.a, self.b],
            "kind": self.kind,
            "bandwidth": self.bandwidth_bytes_per_s,
            "latency_s": self.latency_s,
            "peer_access": self.peer_access,
        }
        if self.measured:  # only when true: unmeasured topologies (and their fingerprints) stay as they were
            out["measured"] = True
        return out
