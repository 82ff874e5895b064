"""MoE alignment: routed (token, expert) slots sorted by expert and padded to whole row blocks.

Contract. Given ``top_index (N, K)`` (each token's ``K`` experts out of ``E``) and a row block size
``BLOCK_M``, the ``S = N * K`` slots (``slot = token * K + k``) are laid out so that every block of
``BLOCK_M`` consecutive entries belongs to one expert:

- ``sorted_slots`` int32 ``(capacity,)``: each expert's slots, in ascending slot order (a stable
  sort: deterministic), the experts in ascending id order, each expert's run padded with the
  sentinel ``S`` up to a multiple of ``BLOCK_M``; every entry past the last expert's run is ``S``
  too. Every slot appears exactly once.
- ``block_expert`` int32 ``(capacity // BLOCK_M,)``: the expert of each block; ``-1`` for blocks past
  the last valid one.
- ``num_valid_blocks`` int32 ``(1,)``: how many leading blocks hold slots (a device tensor).

``capacity = round_up(S + min(E, S) * (BLOCK_M - 1), BLOCK_M)`` depends only on the shapes, never on
the routing, so nothing is read back to the host: the computation is CUDA-graph capturable and a
grouped GEMM can launch ``capacity // BLOCK_M`` row blocks, its programs past ``num_valid_blocks``
returning at once. Pure torch (a few small device ops).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from stagewise.kernels.triton_launch import capturing


class MoeAlignment(NamedTuple):
    sorted_slots: torch.Tensor  # (capacity,) int32, padding = num_slots
    block_expert: torch.Tensor  # (capacity // block_m,) int32, -1 past the valid blocks
    num_valid_blocks: torch.Tensor  # (1,) int32
    num_slots: int  # S = N * K, the padding sentinel
    block_m: int


def align_capacity(num_slots: int, num_experts: int, block_m: int) -> int:
    """Length of ``sorted_slots``: an upper bound on the padded runs that depends only on the shapes."""
    worst = num_slots + min(num_experts, num_slots) * (block_m - 1)  # each used expert pads < block_m
    return -(-worst // block_m) * block_m


def moe_align(top_index: torch.Tensor, num_experts: int, block_m: int) -> MoeAlignment:
    """Sort the slots of ``top_index (N, K)`` by expert into ``block_m``-row blocks (see the module doc)."""
    if block_m <= 0:
        raise ValueError(f"block_m must be positive, got {block_m}")
    device = top_index.device
    flat = top_index.reshape(-1)  # (S,) expert of each slot
    num_slots = flat.numel()
    capacity = align_capacity(num_slots, num_experts, block_m)
    num_blocks = capacity // block_m
    # NOTE: few small ops, all on the device (bincount would read its maximum back to the host)
    expert, order = torch.sort(flat, stable=True)  # (S,) slots grouped by expert, ascending within one
    edges = torch.arange(num_experts + 1, dtype=expert.dtype, device=device)
    bounds = torch.searchsorted(expert, edges)  # (E+1,) where each expert's slots begin among the sorted
    counts = bounds[1:] - bounds[:-1]  # (E,) slots per expert
    blocks = torch.div(counts + (block_m - 1), block_m, rounding_mode="floor")  # (E,) whole blocks per expert
    block_end = torch.cumsum(blocks, 0, dtype=torch.int32)  # (E,)
    shift = (block_end - blocks) * block_m - bounds[:-1]  # (E,) sorted position -> padded position
    dest = torch.arange(num_slots, device=device) + shift.index_select(0, expert)  # (S,) distinct, < capacity
    sorted_slots = torch.full((capacity,), num_slots, dtype=torch.int32, device=device)
    sorted_slots.scatter_(0, dest, order.to(torch.int32))  # distinct destinations: deterministic
    block_ids = torch.arange(num_blocks, dtype=torch.int32, device=device)
    block_expert = torch.searchsorted(block_end, block_ids, right=True, out_int32=True)  # (blocks,) in [0, E]
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    num_valid = block_end[-1:] if num_experts else torch.zeros(1, dtype=torch.int32, device=device)  # (1,)
    return MoeAlignment(sorted_slots, block_expert, num_valid, num_slots, block_m)


_CAPTURED: dict[tuple[int, int, torch.device], MoeAlignment] = {}  # handed to a CUDA graph: never freed


def identity_alignment(rows: int, block_m: int, device: torch.device) -> MoeAlignment:
    """Rows ``0..rows-1`` in order, all of expert 0, padded to whole ``block_m`` blocks: one matrix's
    matmul as a grouped GEMM with a single expert (cached: built once per shape and device).

    NOTE: one handed out while a CUDA graph is captured is kept for good (and handed out from then on):
    the graph holds its tensors' addresses, not references, and its replays call no Python, so they
    never refresh a cache entry. Left in the LRU, a decode graph's alignment was freed while a burst's
    packed steps (one alignment per token count) went by, and the graph's next replay read whatever
    reused that memory as its rows and blocks (issue 44). The others stay in a bounded LRU; a graph's
    is made by the eager passes before its capture (StepGraphs, PackedGraphs), never inside it (a capture
    runs nothing: its tensors would hold no values until a replay, and be kept for good): asking for one
    not yet made while capturing raises ``RuntimeError``."""
    key = (rows, block_m, device)
    held = _CAPTURED.get(key)
    if held is not None:
        return held
    if not capturing(device):
        return _identity_alignment(rows, block_m, device)
    made = _identity_alignment.cache_info().misses
    alignment = _identity_alignment(rows, block_m, device)
    if _identity_alignment.cache_info().misses != made:
        _identity_alignment.cache_clear()  # its tensors hold nothing: no later caller may get them
        raise RuntimeError(f"the identity alignment of {rows} rows in blocks of {block_m} was first asked for inside "
                           f"a CUDA graph capture on {device}: run the step eagerly before capturing it")
    _CAPTURED[key] = alignment
    return alignment


@functools.lru_cache(maxsize=64)
def _identity_alignment(rows: int, block_m: int, device: torch.device) -> MoeAlignment:
    blocks = -(-rows // block_m)
    slots = torch.arange(blocks * block_m, dtype=torch.int32, device=device)
    slots = torch.where(slots < rows, slots, torch.full_like(slots, rows))  # padding = rows
    block_expert = torch.zeros(blocks, dtype=torch.int32, device=device)
    valid = torch.full((1,), blocks, dtype=torch.int32, device=device)
    return MoeAlignment(slots, block_expert, valid, rows, block_m)
