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
inside a graph). :func:`route_and_align` also routes in the same launch: every program computes all
tokens' top-k from the router logits (as :func:`~stagewise.kernels.moe_route_triton.route` does) and
aligns its block from them; program 0 stores the routing. One launch per MoE layer fewer. Sizes are shape-only (the capacity is :func:`~stagewise.kernels.moe_align.align_capacity`),
so the launch is CUDA-graph capturable and nothing is read back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.moe_align import MoeAlignment, align_capacity
from stagewise.kernels.triton_launch import dependent_launch, launch_device

MAX_FUSED_SLOTS = 1024  # routed slots up to which the one-launch alignment is used (all held in registers)


@triton.jit
def _align_block(e, slot, ok, block, num_slots, num_experts, sorted_ptr, block_expert_ptr, valid_ptr,
                 BLOCK_M: tl.constexpr, E_P2: tl.constexpr):
    """Block ``block`` of the alignment from every slot at once: ``e`` its expert, ``slot`` its id (ascending
    over the valid lanes), ``ok`` whether the lane holds a slot (module doc)."""
    e = tl.where(ok, e, E_P2)  # padding -> a bin past every expert
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
    found_slot = tl.sum(tl.where(match, slot[None, :], 0), axis=1)
    tl.store(sorted_ptr + block * BLOCK_M + j, tl.where(found > 0, found_slot, num_slots))  # padding: the sentinel
    tl.store(block_expert_ptr + block, tl.where(owner < num_experts, owner, -1))
    if block == 0:
        tl.store(valid_ptr, tl.sum(blocks, axis=0))


@triton.jit
def _align_kernel(index_ptr, sorted_ptr, block_expert_ptr, valid_ptr, num_slots, num_experts,
                  BLOCK_M: tl.constexpr, E_P2: tl.constexpr, S_P2: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)  # the routing comes from the previous kernel
    block = tl.program_id(0)
    lanes = tl.arange(0, S_P2)  # (S,) every slot at once
    ok = lanes < num_slots
    e = tl.load(index_ptr + lanes, mask=ok, other=E_P2).to(tl.int32)
    _align_block(e, lanes, ok, block, num_slots, num_experts, sorted_ptr, block_expert_ptr, valid_ptr,
                 BLOCK_M, E_P2)


@triton.jit
def _route_align_kernel(logits_ptr, index_ptr, weight_ptr, sorted_ptr, block_expert_ptr, valid_ptr,
                        tokens, num_experts, stride_l,
                        TOP_K: tl.constexpr, K_P2: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_M: tl.constexpr,
                        N_P2: tl.constexpr, E_P2: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)  # the logits come from the router's GEMM
    block = tl.program_id(0)
    n = tl.arange(0, N_P2)
    e = tl.arange(0, E_P2)
    rows = tl.minimum(n, tokens - 1)  # padding rows repeat the last token (never stored)
    logits = tl.load(logits_ptr + rows[:, None] * stride_l + e[None, :], mask=(e < num_experts)[None, :],
                     other=-float("inf")).to(tl.float32)  # (N, E)
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    kk = tl.arange(0, K_P2)
    top_index = tl.zeros((N_P2, K_P2), dtype=tl.int32)
    top_weight = tl.zeros((N_P2, K_P2), dtype=tl.float32)
    total = tl.zeros((N_P2,), dtype=tl.float32)
    remaining = probs
    for k in tl.static_range(TOP_K):  # k-th largest: argmax, then masked out (as `route`)
        best = tl.argmax(remaining, axis=1)  # (N,)
        value = tl.max(remaining, axis=1)
        total += value  # the k largest summed in order, as `route` sums them
        top_index = tl.where(kk[None, :] == k, best[:, None].to(tl.int32), top_index)
        top_weight = tl.where(kk[None, :] == k, value[:, None], top_weight)
        remaining = tl.where(e[None, :] == best[:, None], -1.0, remaining)
    if NORMALIZE:
        top_weight = top_weight / total[:, None]
    stored = (n < tokens)[:, None] & (kk < TOP_K)[None, :]
    if block == 0:
        offs = n[:, None] * TOP_K + kk[None, :]
        tl.store(index_ptr + offs, top_index, mask=stored)
        tl.store(weight_ptr + offs, top_weight.to(weight_ptr.dtype.element_ty), mask=stored)
    lanes = tl.arange(0, N_P2 * K_P2)  # lane n * K_P2 + k holds slot n * TOP_K + k
    slot = (lanes // K_P2) * TOP_K + lanes % K_P2
    ok = ((lanes // K_P2) < tokens) & ((lanes % K_P2) < TOP_K)
    _align_block(tl.reshape(top_index, (N_P2 * K_P2,)), slot, ok, block, tokens * TOP_K, num_experts,
                 sorted_ptr, block_expert_ptr, valid_ptr, BLOCK_M, E_P2)


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
                                     BLOCK_M=block_m, E_P2=triton.next_power_of_2(max(num_experts, 2)),
                                     S_P2=triton.next_power_of_2(num_slots), num_warps=4, **dependent_launch(flat))
    return MoeAlignment(sorted_slots, block_expert, num_valid, num_slots, block_m)


def route_and_align(logits: torch.Tensor, top_k: int, normalize: bool, block_m: int
                    ) -> tuple[torch.Tensor, torch.Tensor, MoeAlignment]:
    """:func:`~stagewise.kernels.moe_route_triton.route` and :func:`moe_align_fused` in one launch: every
    program routes all ``N`` tokens of ``logits`` ``(N, E)`` (softmax, top-k, optional renormalization, in
    float32 as ``route`` computes them), program 0 stores the indices ``(N, K)`` int32 and weights ``(N, K)``
    in the logits' dtype, and each program aligns its block. For at most :data:`MAX_FUSED_SLOTS` slots."""
    tokens, num_experts = logits.shape
    num_slots = tokens * top_k
    if block_m <= 0:
        raise ValueError(f"block_m must be positive, got {block_m}")
    if not 0 < top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be within the {num_experts} experts")
    if not 0 < num_slots <= MAX_FUSED_SLOTS:
        raise ValueError(f"the fused routing takes 1 to {MAX_FUSED_SLOTS} slots, got {num_slots}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    device = logits.device
    capacity = align_capacity(num_slots, num_experts, block_m)
    num_blocks = capacity // block_m
    index = torch.empty((tokens, top_k), dtype=torch.int32, device=device)
    weight = torch.empty((tokens, top_k), dtype=logits.dtype, device=device)
    sorted_slots = torch.empty((capacity,), dtype=torch.int32, device=device)
    block_expert = torch.empty((num_blocks,), dtype=torch.int32, device=device)
    num_valid = torch.empty((1,), dtype=torch.int32, device=device)
    with launch_device(logits):
        _route_align_kernel[(num_blocks,)](
            logits, index, weight, sorted_slots, block_expert, num_valid, tokens, num_experts, logits.stride(0),
            TOP_K=top_k, K_P2=triton.next_power_of_2(top_k), NORMALIZE=normalize, BLOCK_M=block_m,
            N_P2=triton.next_power_of_2(tokens), E_P2=triton.next_power_of_2(max(num_experts, 2)), num_warps=4,
            **dependent_launch(logits))
    return index, weight, MoeAlignment(sorted_slots, block_expert, num_valid, num_slots, block_m)
