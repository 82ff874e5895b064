"""One line describing a placement, e.g. "Fits across 2 GPUs: cuda:0 embedding + blocks 0-20 (19.318 GB) · …"."""

from __future__ import annotations

from stagewise.hardware.sizes import format_bytes
from stagewise.hardware.topology import Topology
from stagewise.placement import CertifiedPlacement

_NOUNS = {"cuda": "GPU", "cpu": "CPU device", "mps": "GPU", "xpu": "GPU", "sim": "device"}


def _noun(cert: CertifiedPlacement, topology: Topology) -> str:
    kinds = {topology.device(s.placement.device_id).kind for s in cert.stages}
    return _NOUNS.get(kinds.pop(), "device") if len(kinds) == 1 else "device"


def placement_summary(cert: CertifiedPlacement, topology: Topology) -> str:
    parts = []
    for st in cert.stages:
        p = st.placement
        what = []
        if p.entry:
            what.append("embedding")
        what.append(f"blocks {p.start}-{p.end - 1}")
        text = " + ".join(what) + (" + head" if p.exit else "")
        parts.append(f"{p.device_id} {text} ({format_bytes(st.charge.total_bytes)})")
    n = len(cert.stages)
    noun = _noun(cert, topology)
    head = f"Fits on one {noun}" if n == 1 else f"Fits across {n} {noun}s"
    return f"{head}: " + " · ".join(parts)
