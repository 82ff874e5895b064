"""A small copy between two GPUs done by the sender's SMs, storing straight into the peer's memory.

A decode step's handoff is a few kilobytes (one token's activation). Through the copy engine
(``cudaMemcpyPeerAsync``) it costs ~12 µs of an H200's time, most of it the engine's start;
loads and stores by one kernel over NVLink take a few µs. Needs peer access from the sending
device to the receiving one (:func:`enable_peer_access`); larger copies (prefill chunks) keep the
copy engine, which streams faster than a few SMs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.triton_launch import cdiv, launch_device

BLOCK = 2048
MAX_KERNEL_BYTES = 1 << 16  # larger copies go through the copy engine


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def enable_peer_access(src: torch.device, dst: torch.device) -> bool:
    """Let kernels on ``src`` read and write ``dst``'s memory; False where the GPUs cannot.

    torch enables peer access (for the sending device) on its first copy between two devices that
    can; a one-element copy makes that happen now rather than on the first step."""
    if src.type != "cuda" or dst.type != "cuda" or src == dst:
        return False
    if not torch.cuda.can_device_access_peer(src, dst):
        return False
    torch.zeros(1, device=dst).copy_(torch.zeros(1, device=src))
    torch.cuda.synchronize(src)
    return True


def peer_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy contiguous ``src`` into contiguous ``dst`` (same dtype and size, ``dst`` on a peer device
    with access enabled) by a kernel on ``src``'s device, in its current stream. The caller orders
    the receiving stream around it."""
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise ValueError(f"peer_copy: {src.dtype} x {src.numel()} into {dst.dtype} x {dst.numel()}")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("peer_copy needs contiguous tensors")
    n = src.numel()
    with launch_device(src):
        _copy_kernel[(cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK, num_warps=4)
