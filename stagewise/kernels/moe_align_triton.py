"""The MoE alignment of :mod:`stagewise.kernels.moe_align` in one Triton launch (batched decode).

Batched decode routes few slots (``S = N * K``, e.g. 32 sequences x 8 experts) per step, and the
torch alignment is about fifteen small launches per MoE layer: at 48 layers that is ~700 launches
of a step's ~2,000. One program computes the same three outputs, entry for entry:

1. per expert, its slot count (one-hot sums over chunks of slots), its whole ``BLOCK_M`` blocks and
   where its padded run begins (a cumulative sum over experts);
2. every slot's rank among the earlier slots of its expert (the one-hot's running sum), so its
   padded position is ``run start + rank`` — the stable, ascending order of ``torch.sort``;
3. the sentinel ``S`` in every position first, a barrier, then each slot at its position; each
   block's expert is the number of runs ending at or before it (``searchsorted(right=True)``).

Sizes are shape-only (the capacity is :func:`~stagewise.kernels.moe_align.align_capacity`), so the
launch is CUDA-graph capturable and nothing is read back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.moe_align import MoeAlignment, align_capacity
from stagewise.kernels.triton_launch import launch_device

MAX_FUSED_SLOTS = 1024  # routed slots up to which the one-program alignment is used (batched decode)
SLOT_CHUNK = 64  # slots per one-hot chunk: (experts, chunk) stays small in registers


@triton.jit
def _align_kernel(index_ptr, sorted_ptr, block_expert_ptr, valid_ptr, num_slots, num_experts, capacity, num_blocks,
                  BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr,
                  NB_CHUNK: tl.constexpr):
    experts = tl.arange(0, E_P2)  # (E,)
    lanes = tl.arange(0, CHUNK)  # (C,)
    counts = tl.zeros((E_P2,), dtype=tl.int32)
    for c0 in range(0, num_slots, CHUNK):
        s = c0 + lanes
        e = tl.load(index_ptr + s, mask=s < num_slots, other=-1).to(tl.int32)  # (C,)
        hot = (e[None, :] == experts[:, None]).to(tl.int32)  # (E, C)
        counts += tl.sum(hot, axis=1)
    blocks = (counts + (BLOCK_M - 1)) // BLOCK_M  # (E,) whole blocks per expert
    block_end = tl.cumsum(blocks, axis=0)  # (E,)
    run_start = (block_end - blocks) * BLOCK_M  # (E,) first padded position of each expert's run
    for p0 in range(0, capacity, FILL):  # every position the sentinel first
        p = p0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + p, tl.full((FILL,), 0, tl.int32) + num_slots, mask=p < capacity)
    tl.debug_barrier()  # NOTE: the fill must land before the slots overwrite it (one program: a CTA barrier)
    seen = tl.zeros((E_P2,), dtype=tl.int32)  # slots of each expert in earlier chunks
    for c0 in range(0, num_slots, CHUNK):
        s = c0 + lanes
        ok = s < num_slots
        e = tl.load(index_ptr + s, mask=ok, other=-1).to(tl.int32)
        hot = (e[None, :] == experts[:, None]).to(tl.int32)  # (E, C)
        rank = tl.cumsum(hot, axis=1) - 1 + seen[:, None]  # (E, C) rank within the expert, where hot
        dest = tl.sum(hot * (run_start[:, None] + rank), axis=0)  # (C,) the slot's padded position
        tl.store(sorted_ptr + dest, s, mask=ok)
        seen += tl.sum(hot, axis=1)
    for b0 in range(0, num_blocks, NB_CHUNK):
        b = b0 + tl.arange(0, NB_CHUNK)
        ends = tl.where(experts[None, :] < num_experts, block_end[None, :], 1 << 30)  # (B, E)
        owner = tl.sum((ends <= b[:, None]).to(tl.int32), axis=1)  # (B,) runs ending at or before b
        owner = tl.where(owner < num_experts, owner, -1)
        tl.store(block_expert_ptr + b, owner, mask=b < num_blocks)
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
        _align_kernel[(1,)](flat, sorted_slots, block_expert, num_valid, num_slots, num_experts, capacity, num_blocks,
                            BLOCK_M=block_m, E_P2=triton.next_power_of_2(max(num_experts, 2)), CHUNK=SLOT_CHUNK,
                            FILL=1024, NB_CHUNK=64, num_warps=8)
    return MoeAlignment(sorted_slots, block_expert, num_valid, num_slots, block_m)
