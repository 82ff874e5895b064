"""PeakMemory: what a CUDA device's allocator held at its peak, beside what was resident before.

The load check's measurement of workspace: the certificate charges each stage weights + state +
workspace + reserve, and the first two are counted from the tensors; workspace is what steps allocate
on top, so it is measured as the allocator's peak (``torch.cuda.max_memory_allocated``) over the warm-up
and a step at the largest prefill chunk and full context, minus what was resident when they began.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PeakMemory:
    """One device: ``resident_bytes`` allocated when measuring began, ``peak_bytes`` the most allocated
    since (both from the caching allocator, every tensor on the device counted)."""

    device: str
    resident_bytes: int
    peak_bytes: int

    @property
    def workspace_bytes(self) -> int:
        """What steps allocated above the resident tensors, at the peak."""
        return max(0, self.peak_bytes - self.resident_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "resident_bytes": self.resident_bytes, "peak_bytes": self.peak_bytes,
                "workspace_bytes": self.workspace_bytes}


class PeakMeter:
    """Measures the peak of the CUDA devices among ``torch_devices`` (others are not measured)."""

    def __init__(self, torch_devices: Iterable[str]) -> None:
        self.devices = sorted({d for d in torch_devices if torch.device(d).type == "cuda"})
        self._resident: dict[str, int] = {}

    def start(self) -> None:
        """Record what is resident and restart each device's peak from there."""
        for name in self.devices:
            device = torch.device(name)
            torch.cuda.synchronize(device)
            self._resident[name] = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)

    def read(self) -> dict[str, PeakMemory]:
        """Each measured device's reading since :meth:`start`."""
        out = {}
        for name in self.devices:
            device = torch.device(name)
            torch.cuda.synchronize(device)
            out[name] = PeakMemory(name, self._resident.get(name, 0), torch.cuda.max_memory_allocated(device))
        return out
