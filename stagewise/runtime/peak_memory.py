"""PeakMemory: what a CUDA device's allocator held at its peak, beside what was resident before.

The load check's measurement of workspace: the certificate charges each stage weights + state +
workspace + reserve, and the first two are counted from the tensors; workspace is what steps allocate
on top, so it is measured as the allocator's peak (``torch.cuda.max_memory_allocated``) over the warm-up
and a step at the largest prefill chunk and full context, minus what was resident when they began.

CUDA graphs keep what their captures allocated in private pools, also once those tensors are freed:
the replays write there. ``max_memory_allocated`` counts such a block only while a tensor holds it, so
after the captures a step's eager tensors (another pool) and the graphs' idle blocks are both on the
device while the counter sees only the first. The reading therefore adds, from the point the captures
are done (:meth:`PeakMeter.checkpoint`), the graphs' idle bytes (:func:`graph_pool_idle_bytes`): the
caching allocator's other free blocks are not counted, since an out-of-memory retry releases them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_POOL = (0, 0)  # the caching allocator's own pool in a snapshot's ``segment_pool_id``


def graph_pool_idle_bytes(segments: Iterable[Mapping[str, Any]], device_index: int) -> int:
    """Bytes of device ``device_index`` that CUDA graphs' private pools hold and no tensor uses, from the
    segments of ``torch.cuda.memory_snapshot()``: the captures' temporaries, kept for the replays."""
    return sum(int(s["total_size"]) - int(s["allocated_size"]) for s in segments
               if s.get("device") == device_index and tuple(s.get("segment_pool_id", DEFAULT_POOL)) != DEFAULT_POOL)


@dataclass(frozen=True)
class PeakMemory:
    """One device: ``resident_bytes`` allocated when measuring began, ``peak_bytes`` the most held since
    (every tensor on the device, from the caching allocator, plus ``graph_pool_bytes``: the CUDA graphs'
    idle blocks at the measured peak's time)."""

    device: str
    resident_bytes: int
    peak_bytes: int
    graph_pool_bytes: int = 0

    @property
    def workspace_bytes(self) -> int:
        """What steps allocated above the resident tensors, at the peak."""
        return max(0, self.peak_bytes - self.resident_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "resident_bytes": self.resident_bytes, "peak_bytes": self.peak_bytes,
                "graph_pool_bytes": self.graph_pool_bytes, "workspace_bytes": self.workspace_bytes}


class PeakMeter:
    """Measures the peak of the CUDA devices among ``torch_devices`` (others are not measured).

    :meth:`start`, the steps that capture graphs, :meth:`checkpoint`, the steps to measure with the
    graphs' idle blocks counted, :meth:`read`. Without a checkpoint the idle blocks at the end are added
    to the whole run's peak: an upper bound (a block a capture held counts twice)."""

    def __init__(self, torch_devices: Iterable[str]) -> None:
        self.devices = sorted({d for d in torch_devices if torch.device(d).type == "cuda"})
        self._resident: dict[str, int] = {}
        self._captures_peak: dict[str, int] = {}  # the peak up to the checkpoint, tensors only

    def start(self) -> None:
        """Record what is resident and restart each device's peak from there."""
        self._captures_peak = {}
        for name in self.devices:
            device = torch.device(name)
            torch.cuda.synchronize(device)
            self._resident[name] = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)

    def checkpoint(self) -> None:
        """The graphs are captured: keep the peak so far and count their idle blocks from here on."""
        for name in self.devices:
            device = torch.device(name)
            torch.cuda.synchronize(device)
            self._captures_peak[name] = max(self._captures_peak.get(name, 0), torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)

    def read(self) -> dict[str, PeakMemory]:
        """Each measured device's reading since :meth:`start`."""
        out = {}
        segments = torch.cuda.memory_snapshot() if self.devices else []
        for name in self.devices:
            device = torch.device(name)
            torch.cuda.synchronize(device)
            idle = graph_pool_idle_bytes(segments, _index(device))
            peak = max(self._captures_peak.get(name, 0), torch.cuda.max_memory_allocated(device) + idle)
            out[name] = PeakMemory(name, self._resident.get(name, 0), peak, idle)
        return out


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
