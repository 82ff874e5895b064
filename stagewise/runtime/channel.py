"""Channels that move a :class:`Handoff` between two stages, chosen from the link between them.

- same device: no copy;
- peer copy: a device-to-device copy (NVLink / PCIe peer access);
- host-staged: device -> pinned host buffer -> device.
A torch.distributed channel (other processes or hosts) implements the same ``send``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from stagewise.runtime.handoff import Handoff


class Channel(Protocol):
    kind: str

    def send(self, handoff: Handoff) -> Handoff:
        """Deliver ``handoff`` to the receiving stage's device; returns what the receiver sees."""
        ...


class SameDeviceChannel:
    kind = "same-device"

    def send(self, handoff: Handoff) -> Handoff:
        return handoff


class PeerCopyChannel:
    kind = "peer-copy"

    def __init__(self, dst: torch.device) -> None:
        self.dst = dst

    def send(self, handoff: Handoff) -> Handoff:
        hidden = handoff.hidden.to(self.dst, non_blocking=True)  # ordered after the sender's stream
        return Handoff(handoff.step_id, handoff.positions, hidden)


class HostStagedChannel:
    kind = "host-staged"

    def __init__(self, dst: torch.device) -> None:
        self.dst = dst
        self._pinned: torch.Tensor | None = None

    def _buffer(self, like: torch.Tensor) -> torch.Tensor:
        numel = like.numel()
        if self._pinned is None or self._pinned.numel() < numel or self._pinned.dtype != like.dtype:
            pin = like.device.type == "cuda"
            self._pinned = torch.empty(numel, dtype=like.dtype, pin_memory=pin)
        return self._pinned[:numel].view(like.shape)

    def send(self, handoff: Handoff) -> Handoff:
        staged = self._buffer(handoff.hidden)
        staged.copy_(handoff.hidden)  # device -> pinned host (synchronous: the buffer is reused)
        hidden = staged.to(self.dst, non_blocking=False)
        return Handoff(handoff.step_id, handoff.positions, hidden)


def channel_for(src: torch.device, dst: torch.device, link_kind: str | None) -> Channel:
    """Pick the channel for a boundary from the devices and the topology's link kind."""
    if src == dst:
        return SameDeviceChannel()
    if link_kind in ("pcie-host-staged", "network") or src.type != dst.type or src.type == "cpu":
        return HostStagedChannel(dst)
    return PeerCopyChannel(dst)
