"""DistributedChannel: a stage boundary between two processes (or hosts), over torch.distributed.

The sending process calls :meth:`DistributedChannel.send` (the :class:`Channel` protocol), the
receiving one :meth:`DistributedChannel.recv`, which rebuilds the :class:`Handoff` and checks it
with :meth:`Handoff.check`. On the wire, in order:

1. a fixed int64 header ``[magic, status, step_id, B, T, H, dtype code, n positions inline,
   p0..p7]`` — positions ride inline when ``B*T <= 8`` (every decode step);
2. the positions ``(B*T,)`` int64, only when they did not fit inline;
3. the hidden activation ``(B, T, H)``, only when ``status`` is OK.

A sender whose step failed sends an ABORT header instead, so the receiver fails at once (and
passes the abort downstream) instead of waiting for the group's timeout. With NCCL every wire
tensor lives on the stage's GPU; with Gloo on the host (a GPU activation is staged through host
memory).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from stagewise.errors import HandoffError
from stagewise.runtime.handoff import Handoff

MAGIC = 0x53544147  # "STAG"
STATUS_OK = 0
STATUS_ABORT = 1
INLINE_POSITIONS = 8
HEADER_LEN = 8 + INLINE_POSITIONS
DTYPE_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


class UpstreamAborted(Exception):
    """The sending side of a boundary failed this step and said so (an ABORT header)."""


def encode_header(status: int, step_id: int, shape: tuple[int, ...], dtype: torch.dtype,
                  positions: torch.Tensor) -> torch.Tensor:
    """The fixed header of one handoff, as a host int64 tensor ``(HEADER_LEN,)``."""
    header = torch.zeros(HEADER_LEN, dtype=torch.int64)
    b, t, h = shape if len(shape) == 3 else (0, 0, 0)
    header[:8] = torch.tensor([MAGIC, status, step_id, b, t, h, DTYPE_CODES.get(dtype, 0), 0])
    flat = positions.reshape(-1).to(torch.int64)
    if status == STATUS_OK and flat.numel() <= INLINE_POSITIONS:
        header[7] = flat.numel()
        header[8 : 8 + flat.numel()] = flat
    else:
        header[7] = -1  # positions follow in their own message
    return header


class DistributedChannel:
    """One boundary: ``peer`` is the other end's rank in the data process group; ``wire`` the
    device tensors travel from (``cpu`` for Gloo, the stage's GPU for NCCL); ``device`` the
    stage's own device on this side."""

    kind = "distributed"

    def __init__(self, peer: int, wire: torch.device, device: torch.device) -> None:
        self.peer = peer
        self.wire = wire
        self.device = device
        self.last_transfer_s = 0.0  # receiver: header arrival -> activation received and checked

    def send(self, handoff: Handoff, into: torch.Tensor | None = None) -> Handoff:
        """Send ``handoff`` to the peer; returns it unchanged (the receiver sees its own copy, so
        ``into``, a buffer on this side, cannot be delivered into)."""
        if into is not None:
            raise ValueError("a distributed channel delivers into the receiving process, not into a local buffer")
        positions = handoff.positions.cpu()
        header = encode_header(STATUS_OK, handoff.step_id, handoff.shape, handoff.dtype, positions)
        dist.send(header.to(self.wire), self.peer)
        if header[7] < 0:
            dist.send(positions.reshape(-1).to(torch.int64).to(self.wire), self.peer)
        dist.send(handoff.hidden.contiguous().to(self.wire), self.peer)
        return handoff

    def send_abort(self, step_id: int) -> None:
        """Tell the peer this step failed upstream (best effort: the peer may be gone too)."""
        header = encode_header(STATUS_ABORT, step_id, (0, 0, 0), torch.float32, torch.empty(0))
        dist.send(header.to(self.wire), self.peer)

    def recv(self, step_id: int, positions: torch.Tensor, hidden_size: int, dtype: torch.dtype) -> Handoff:
        """Receive the next handoff and check it against what this step expects.

        Raises :class:`UpstreamAborted` on an ABORT header and :class:`HandoffError` on a bad
        header or a handoff that is not the one expected.
        """
        header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.wire)
        dist.recv(header, self.peer)
        head = header.cpu()
        t0 = time.perf_counter()
        magic, status, got_step, b, t, h, code, inline = head.tolist()[:8]
        if magic != MAGIC:
            raise HandoffError(f"handoff from data rank {self.peer}: bad header (magic {magic:#x})")
        if status == STATUS_ABORT:
            raise UpstreamAborted(f"step {got_step} failed upstream of data rank {self.peer}")
        if code not in CODE_DTYPES:
            raise HandoffError(f"handoff from data rank {self.peer}: unknown dtype code {code}")
        if inline >= 0:
            got_positions = head[8 : 8 + inline].reshape(b, t)
        else:
            flat = torch.empty(b * t, dtype=torch.int64, device=self.wire)
            dist.recv(flat, self.peer)
            got_positions = flat.cpu().reshape(b, t)
        hidden = torch.empty((b, t, h), dtype=CODE_DTYPES[code], device=self.wire)
        dist.recv(hidden, self.peer)
        received = Handoff(got_step, got_positions, hidden.to(self.device))
        received.check(step_id, positions.cpu(), hidden_size, dtype)
        self.last_transfer_s = time.perf_counter() - t0
        return received
