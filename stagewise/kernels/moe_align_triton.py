"""The MoE alignment of :mod:`stagewise.kernels.moe_align` in one Triton launch (batched decode).

Batched decode routes few slots (``S = N * K``, e.g. 32 sequences x 8 experts) per step, and the
torch alignment is about fifteen small launches per MoE layer: at 48 layers that is ~700 launches
of a step's ~2,000. One launch computes the same three outputs, entry for entry, one program per
``BLOCK_M`` block of the padded layout, each from all ``S`` slots held in registers (one load):

1. per expert, its slot count (a histogram), its whole blocks and where its padded run begins (a
   cumulative sum over experts); the block's owner is the number of runs ending at or before it
   (``searchsorted(right=True)``), ``-1`` past the last run;
2. every slot of the owner ranked among them in ascending slot order (a running sum): the block's
   entry ``j`` is the slot of rank ``block * BLOCK_M - run start + j``, else the sentinel ``S``.

No program waits on another (the old single-program kernel was a chain of dependent phases: 16.7 us
inside a graph). Sizes are shape-only (the capacity is :func:`~stagewise.kernels.moe_align.align_capacity`),
so the launch is CUDA-graph capturable and nothing is read back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.moe_align import MoeAlignment, align_capacity
from stagewise.kernels.triton_launch import dependent_launch, launch_device, next_power_of_2

MAX_FUSED_SLOTS = 1024  # routed slots up to which the one-launch alignment is used (all held in registers)


@triton.jit
def _align_kernel(index_ptr, sorted_ptr, block_expert_ptr, valid_ptr, num_slots, num_experts,
                  BLOCK_M: tl.constexpr, E_P2: tl.constexpr, S_P2: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)  # the routing comes from the previous kernel
    block = tl.program_id(0)
    lanes = tl.arange(0, S_P2)  # (S,) every slot at once
    ok = lanes < num_slots
    e = tl.load(index_ptr + lanes, mask=ok, other=E_P2).to(tl.int32)  # padding -> a bin past every expert
    experts = tl.arange(0, 2 * E_P2)  # (2E,) bins; those >= num_experts are ignored
    real = experts < num_experts
    counts = tl.where(real, tl.histogram(e, 2 * E_P2), 0)  # (2E,) slots per expert
    blocks = (counts + (BLOCK_M - 1)) // BLOCK_M  # (2E,) whole blocks per expert
    block_end = tl.cumsum(blocks, axis=0)  # (2E,)
    owner = tl.sum((real & (block_end <= block)).to(tl.int32), axis=0)  # runs ending at or before this block
    owner_start = tl.sum(tl.where(experts == owner, (block_end - blocks) * BLOCK_M, 0), axis=0)  # its run's start
    hot = ok & (e == owner)  # (S,) the owner's slots
    rank = tl.cumsum(hot.to(tl.int32), axis=0) - 1  # (S,) rank among them: ascending slot order
    first = block * BLOCK_M - owner_start  # rank of this block's first entry
    j = tl.arange(0, BLOCK_M)
    match = hot[None, :] & (rank[None, :] == first + j[:, None])  # (BM, S) at most one per row
    found = tl.sum(match.to(tl.int32), axis=1)
    slot = tl.sum(tl.where(match, lanes[None, :], 0), axis=1)
    tl.store(sorted_ptr + block * BLOCK_M + j, tl.where(found > 0, slot, num_slots))  # padding: the sentinel
    tl.store(block_expert_ptr + block, tl.where(owner < num_experts, owner, -1))
    if block == 0:
        tl.store(valid_ptr, tl.sum(blocks, axis=0))


def moe_align_fused(top_index: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """:func:`~stagewise.kernels.moe_align.moe_align` in one launch, equal entry for entry (for at most
    :data:`MAX_FUSED_SLOTS` slots)."""
    if block_m <= 0:
        raise ValueError(f"block_m must be positive, got {block_m}")
    flat = top_index.reshape(-1).contiguous()  # (S,)
    num_slots = flat.numel()
    if num_slots > MAX_FUSED_SLOTS:
        raise ValueError(f"the fused alignment takes at most {MAX_FUSED_SLOTS} slots, got {num_slots}")
    capacity = align_capacity(num_slots, num_experts, block_m)
    num_blocks = capacity // block_m
    device = flat.device
    sorted_slots = torch.empty((capacity,), dtype=torch.int32, device=device)
    block_expert = torch.empty((num_blocks,), dtype=torch.int32, device=device)
    num_valid = torch.empty((1,), dtype=torch.int32, device=device)
    if num_slots == 0:
        sorted_slots.fill_(0)
        block_expert.fill_(-1)
        num_valid.zero_()
        return MoeAlignment(sorted_slots, block_expert, num_valid, 0, block_m)
    with launch_device(flat):
        _align_kernel[(num_blocks,)](flat, sorted_slots, block_expert, num_valid, num_slots, num_experts,
                                     BLOCK_M=block_m, E_P2=next_power_of_2(max(num_experts, 2)),
                                     S_P2=next_power_of_2(num_slots), num_warps=4, **dependent_launch(flat))
    return MoeAlignment(sorted_slots, block_expert, num_valid, num_slots, block_m)
