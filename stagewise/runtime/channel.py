"""Channels that move a :class:`Handoff` between two stages, chosen from the link between them.

- same device: no copy;
- peer copy: a device-to-device copy (NVLink / PCIe peer access); a decode step's few kilobytes
  are stored into the receiver's memory by a kernel on the sender (no copy-engine start);
- host-staged: device -> pinned host buffer -> device.
A torch.distributed channel (other processes or hosts) implements the same ``send``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from stagewise.kernels.triton_launch import use_triton
from stagewise.runtime.handoff import Handoff


class Channel(Protocol):
    kind: str

    def send(self, handoff: Handoff, into: torch.Tensor | None = None) -> Handoff:
        """Deliver ``handoff`` to the receiving stage's device; returns what the receiver sees.
        ``into``: a buffer of the activation's shape on the receiving device to deliver into (the
        receiver's graph input), so the receiver copies nothing."""
        ...


def _delivered(handoff: Handoff, hidden: torch.Tensor) -> Handoff:
    return Handoff(handoff.step_id, handoff.positions, hidden)


class SameDeviceChannel:
    kind = "same-device"

    def send(self, handoff: Handoff, into: torch.Tensor | None = None) -> Handoff:
        if into is None:
            return handoff
        into.copy_(handoff.hidden)
        return _delivered(handoff, into)


class PeerCopyChannel:
    kind = "peer-copy"

    def __init__(self, src: torch.device, dst: torch.device) -> None:
        from stagewise.kernels.peer_copy_triton import enable_peer_access

        self.src = src
        self.dst = dst
        self.store_kernel = enable_peer_access(src, dst)  # small handoffs stored by the sender's SMs

    def send(self, handoff: Handoff, into: torch.Tensor | None = None) -> Handoff:
        from stagewise.kernels.peer_copy_triton import MAX_KERNEL_BYTES, peer_copy

        hidden = handoff.hidden
        if into is None:
            return _delivered(handoff, hidden.to(self.dst, non_blocking=True))  # ordered after the sender's stream
        small = hidden.numel() * hidden.element_size() <= MAX_KERNEL_BYTES
        if self.store_kernel and small and use_triton(hidden) and hidden.is_contiguous() and hidden.dtype == into.dtype:
            sender, receiver = torch.cuda.current_stream(self.src), torch.cuda.current_stream(self.dst)
            sender.wait_stream(receiver)  # the receiver is done reading ``into`` (its previous step)
            peer_copy(hidden, into)
            receiver.wait_stream(sender)
        else:
            into.copy_(hidden, non_blocking=True)  # copy engine; torch orders both devices' streams
        return _delivered(handoff, into)


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

    def send(self, handoff: Handoff, into: torch.Tensor | None = None) -> Handoff:
        staged = self._buffer(handoff.hidden)
        staged.copy_(handoff.hidden)  # device -> pinned host (synchronous: the buffer is reused)
        if into is None:
            return _delivered(handoff, staged.to(self.dst, non_blocking=False))
        into.copy_(staged, non_blocking=False)
        return _delivered(handoff, into)


def channel_for(src: torch.device, dst: torch.device, link_kind: str | None) -> Channel:
    """Pick the channel for a boundary from the devices and the topology's link kind."""
    if src == dst:
        return SameDeviceChannel()
    if link_kind in ("pcie-host-staged", "network") or src.type != dst.type or src.type == "cpu":
        return HostStagedChannel(dst)
    return PeerCopyChannel(src, dst)
