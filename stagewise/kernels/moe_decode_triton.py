"""Q8_0 GEMM for a few rows per weight: batched-decode experts and dense projections of 3-64 rows.

Contract as :func:`~stagewise.kernels.moe_grouped_triton.grouped_gemm` (``out[s] = A[row(s)] @
W[expert(s)].T`` over the alignment's blocks, optionally times the slot's routing weight), for a
Q8_0 stack only. What differs is where the scale is applied: each 32-value Q8_0 block's int8 values
enter ``tl.dot`` as they are (exact in bf16/f16: ``|q| <= 128``), and the block's f16 scale
multiplies that partial dot in float32 — the Q8_0 GEMV's order (sum the block, then scale), not the
prefill GEMM's (dequantize each value, round it to the activation dtype, then dot).

Shapes of the work (:class:`DecodeTiles`):

- ``swap``: the weight tile ``(BN, 32)`` is the dot's left operand and the routed rows its right one
  (``W @ A.T``): the int8 tile is used as it is stored (K innermost), and the few rows per expert
  fill the dot's narrow side instead of padding its tall one.
- ``split_k``: the K steps are shared by ``split_k`` programs per output tile, each writing a float32
  partial; the last of them to finish (an acquire/release counter per tile, reset by that program)
  sums the partials in split order 0, 1, ... — the same order whichever program is last, so the
  result is deterministic. More programs keep more loads in flight when there are few output tiles
  (a dense 2048 x 4096 projection has 64).
- ``glu`` (:func:`decode_gemm_glu`): the program computes the gate rows and the matching up rows of a
  fused gate/up weight and stores ``silu(gate) * up``, each rounded to the activation dtype first,
  exactly as :func:`~stagewise.kernels.silu_mul_triton.silu_mul` computes it from the stored pair.
- ``tma``: the weight tiles come by the tensor memory accelerator (Hopper and later), reading the stack
  as one ``(E * out, in)`` matrix; ``wide``: one ``(BN, block_k)`` box a K step (and half), whose
  32-column groups are views of it, instead of one ``(BN, 32)`` box a group. Each box row is then a
  ``block_k``-byte run, not 32 bytes: on an H200 the experts' GEMMs read 3.5-3.6 TB/s instead of
  3.2-3.4 (``q8_0_decode_wide_tma*_h200.json``). The arithmetic is the same: results are bit-identical.

Every program waits for its predecessor before it reads the alignment (dependent launch).

Counters live in one int32 buffer per (device, stream), zero between launches (each tile's last
program resets its counter), so launches on one stream never share a counter while one is in flight; a
CUDA graph reads the buffer of the stream it was captured on, made before the capture
(:func:`reserve_tile_counters`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from stagewise.kernels.expert_stacks import Q8_0Stack
from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.moe_align import MoeAlignment
from stagewise.kernels.triton_launch import capturing, cdiv, dependent_launch, hopper_or_later, launch_device

QBLOCK = 32


@dataclass(frozen=True)
class DecodeTiles:
    """Tiles of one decode GEMM: ``block_n`` outputs per program, ``block_k`` per K step (a multiple of
    32 dividing ``in``), ``split_k`` programs per output tile, ``swap``: weights as the dot's left side."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    swap: bool = False
    tma: bool = False  # weight tiles by the tensor memory accelerator where the device has one (module doc)
    wide: bool = False  # TMA: one (block_n, block_k) box a K step, not one (block_n, 32) box a block (module doc)


@dataclass(frozen=True)
class DecodeConfig:
    """Batched-decode experts of Q8_0 stacks: ``block_m``-row blocks through this module's GEMMs (scale
    after each block's dot, SiLU·up fused into the gate_up GEMM) and the slots summed by the decode
    path's combine (:func:`~stagewise.kernels.moe_experts.grouped_swiglu_experts`)."""

    block_m: int
    gate_up: DecodeTiles
    down: DecodeTiles
    fuse_silu: bool = True  # SiLU·up in the gate_up GEMM's epilogue (else a separate silu_mul launch)


# the decode kernels' tiles, fastest of the sweeps on an H200 at 32 sequences of Qwen3-30B-A3B
# (q8_0_decode_sweep_h200.json, q8_0_decode_wide_tma2_h200.json; the sweep scripts are in git at 1f282a2): weights
# on the dot's tall side (swap), by TMA in one box a K step (wide); gate_up with SiLU·up fused, 32 rows a program,
# 128-wide K steps in three stages; down (K = 768) 64 rows, 64-wide K steps in three stages. 103.9 / 51.3 us
# (3.6 / 3.6 TB/s) against 118.3 / 55.5 us with one box a 32-column group (the tiles before: 64 rows for gate_up,
# two stages)
DECODE_Q8_0 = DecodeConfig(16, DecodeTiles(32, 128, 2, 3, swap=True, tma=True, wide=True),
                           DecodeTiles(64, 64, 2, 3, swap=True, tma=True, wide=True))


@triton.jit
def store_tile(acc, out_ptr, route_ptr, slots, row_ok, offs_n, n_ok, stride_om, stride_on,
                SWAP: tl.constexpr, ROUTE_WEIGHT: tl.constexpr):
    """Store ``acc`` (``(BN, BM)`` when ``SWAP`` else ``(BM, BN)``), times the slot's routing weight."""
    if SWAP:
        if ROUTE_WEIGHT:
            acc = acc * tl.load(route_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)[None, :]
        ptrs = out_ptr + slots[None, :].to(tl.int64) * stride_om + offs_n[:, None] * stride_on
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[None, :] & n_ok[:, None])
    else:
        if ROUTE_WEIGHT:
            acc = acc * tl.load(route_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)[:, None]
        ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def silu_mul_tile(gate, up, dtype: tl.constexpr):
    """``silu(g) * u`` of the float32 accumulators, each rounded to ``dtype`` first (as stored and reloaded)."""
    g = gate.to(dtype).to(tl.float32)
    u = up.to(dtype).to(tl.float32)
    return g * tl.sigmoid(g) * u


@triton.jit
def _block_dot(a, q, SWAP: tl.constexpr, BF16: tl.constexpr):
    """One Q8_0 block's dot, float32: ``q (BN, 32) @ a (32, BM)`` when ``SWAP`` else ``a (BM, 32) @ q.T``."""
    if BF16:
        w = q.to(tl.bfloat16)  # int8 is exact in bf16
        if SWAP:
            part = tl.dot(w, a)
        else:
            part = tl.dot(a, tl.trans(w))
    else:  # float32 activations (the interpreter holds bf16 as raw uint16: float32 there too)
        w = q.to(tl.float32)
        if SWAP:
            part = tl.dot(w, a, input_precision="ieee")
        else:
            part = tl.dot(a, tl.trans(w), input_precision="ieee")
    return part


@triton.jit
def _halves(t, BN: tl.constexpr, W: tl.constexpr):
    """``(BN, 2W)`` -> its columns ``[0, W)`` and ``[W, 2W)``."""
    return tl.split(tl.permute(tl.reshape(t, (BN, 2, W)), (0, 2, 1)))


@triton.jit
def _group(t, g: tl.constexpr, BN: tl.constexpr, GROUPS: tl.constexpr):
    """Columns ``[32 g, 32 g + 32)`` of a ``(BN, 32 GROUPS)`` tile (``GROUPS`` 1, 2, 4 or 8)."""
    if GROUPS == 1:
        out = t
    elif GROUPS == 2:
        lo, hi = _halves(t, BN, 32)
        out = lo if g == 0 else hi
    elif GROUPS == 4:
        lo, hi = _halves(t, BN, 64)
        a, b = _halves(lo if g < 2 else hi, BN, 32)
        out = a if g % 2 == 0 else b
    else:
        lo, hi = _halves(t, BN, 128)
        lo2, hi2 = _halves(lo if g < 4 else hi, BN, 64)
        a, b = _halves(lo2 if g % 4 < 2 else hi2, BN, 32)
        out = a if g % 2 == 0 else b
    return out


@triton.jit
def _decode_gemm_kernel(
    a_ptr, q_ptr, q_desc, s_ptr, out_ptr, route_ptr, part_ptr, lock_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, K, num_slots, top_k, up_offset, rows_per_expert,
    stride_am, stride_ak, stride_qe, stride_qn, stride_qk,
    stride_se, stride_sn, stride_sk, stride_om, stride_on,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, BF16: tl.constexpr, GLU: tl.constexpr,
    SWAP: tl.constexpr, SPLIT_K: tl.constexpr, TMA: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, GDC: tl.constexpr,
):
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_k = pid % SPLIT_K  # the K splits of one tile are neighbours: they share the tile's rows
    tile = pid // SPLIT_K
    pid_n = tile % n_tiles
    pid_m = tile // n_tiles
    wait_for_predecessor(GDC)  # the alignment and the activations come from earlier kernels
    if pid_m >= tl.load(valid_ptr):
        return  # a padding block past every expert's run
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    slots = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # (BM,)
    row_ok = slots < num_slots
    rows = slots // top_k if GATHER_ROWS else slots
    rows = tl.where(row_ok, rows, 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, 32)  # one Q8_0 block
    steps = K // (32 * GROUPS)  # K is a whole number of K steps (checked by the caller)
    per_split = tl.cdiv(steps, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, steps)
    k0 = first * 32 * GROUPS
    q_rows = q_ptr + expert * stride_qe + offs_n.to(tl.int64) * stride_qn  # (BN,)
    s_rows = s_ptr + expert * stride_se + offs_n.to(tl.int64) * stride_sn + first * GROUPS * stride_sk  # (BN,)
    q_ptrs = q_rows[:, None] + (k0 + offs_k[None, :]) * stride_qk  # (BN, 32)
    if SWAP:
        a_ptrs = a_ptr + rows[None, :] * stride_am + (k0 + offs_k[:, None]) * stride_ak  # (32, BM)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        a_ptrs = a_ptr + rows[:, None] * stride_am + (k0 + offs_k[None, :]) * stride_ak  # (BM, 32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up_q = up_offset * stride_qn
    up_s = up_offset * stride_sn
    tma_row = (expert * rows_per_expert + pid_n * BLOCK_N).to(tl.int32)  # TMA: the tile's first row, 2-D view
    groups = tl.arange(0, GROUPS)
    for step in range(first, last):
        # this step's (BN, G) scales in one load (one load per group measured slower); group g's column is
        # picked in registers
        sc = tl.load(s_rows[:, None] + groups[None, :] * stride_sk, mask=n_ok[:, None], other=0.0)
        if GLU:
            sc_up = tl.load(s_rows[:, None] + up_s + groups[None, :] * stride_sk, mask=n_ok[:, None], other=0.0)
        else:
            sc_up = sc
        if WIDE:  # one TMA box per K step (and half): its groups are views of it
            q_step = q_desc.load([tma_row, step * GROUPS * 32])  # (BN, 32 G) int8
            q_step_up = q_step
            if GLU:
                q_step_up = q_desc.load([tma_row + up_offset, step * GROUPS * 32])
        for g in tl.static_range(GROUPS):
            if SWAP:
                a = tl.load(a_ptrs + g * 32 * stride_ak, mask=row_ok[None, :], other=0.0)  # (32, BM)
            else:
                a = tl.load(a_ptrs + g * 32 * stride_ak, mask=row_ok[:, None], other=0.0)  # (BM, 32)
            if not BF16:  # NOTE: the interpreter holds bf16 as raw uint16: float32 there
                a = a.to(tl.float32)
            for half in tl.static_range(2 if GLU else 1):
                if WIDE:
                    q = _group(q_step if half == 0 else q_step_up, g, BLOCK_N, GROUPS)
                elif TMA:
                    q = q_desc.load([tma_row + half * up_offset, (step * GROUPS + g) * 32])  # (BN, 32) int8
                else:
                    q = tl.load(q_ptrs + half * up_q + g * 32 * stride_qk, mask=n_ok[:, None], other=0)  # (BN, 32) int8
                s = tl.sum(tl.where(groups[None, :] == g, sc if half == 0 else sc_up, 0.0), axis=1).to(tl.float32)
                part = _block_dot(a, q, SWAP, BF16)
                if SWAP:
                    part = part * s[:, None]  # (BN, BM)
                else:
                    part = part * s[None, :]  # (BM, BN)
                if half == 0:
                    acc += part
                else:
                    acc_up += part
        a_ptrs += 32 * GROUPS * stride_ak
        q_ptrs += 32 * GROUPS * stride_qk
        s_rows += GROUPS * stride_sk
    if SPLIT_K > 1:
        plane = num_slots * N
        if SWAP:  # the tile's float32 partial in a (num_slots, N) plane
            offs = slots[None, :].to(tl.int64) * N + offs_n[:, None]
            mask = row_ok[None, :] & n_ok[:, None]
        else:
            offs = slots[:, None].to(tl.int64) * N + offs_n[None, :]
            mask = row_ok[:, None] & n_ok[None, :]
        tl.store(part_ptr + pid_k * plane + offs, acc, mask=mask)
        if GLU:
            tl.store(part_ptr + (SPLIT_K + pid_k) * plane + offs, acc_up, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        done = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel")
        if done == SPLIT_K - 1:  # the last program of this tile: sum the partials in split order
            tl.debug_barrier()
            acc = tl.zeros(acc.shape, dtype=tl.float32)
            acc_up = tl.zeros(acc.shape, dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):
                acc += tl.load(part_ptr + j * plane + offs, mask=mask, other=0.0, cache_modifier=".cg")
                if GLU:
                    acc_up += tl.load(part_ptr + (SPLIT_K + j) * plane + offs, mask=mask, other=0.0,
                                      cache_modifier=".cg")
            tl.store(lock_ptr + tile, 0)  # zero again for the next launch on this stream
            if GLU:
                acc = silu_mul_tile(acc, acc_up, out_ptr.dtype.element_ty)
            store_tile(acc, out_ptr, route_ptr, slots, row_ok, offs_n, n_ok, stride_om, stride_on,
                        SWAP, ROUTE_WEIGHT)
    else:
        if GLU:
            acc = silu_mul_tile(acc, acc_up, out_ptr.dtype.element_ty)
        store_tile(acc, out_ptr, route_ptr, slots, row_ok, offs_n, n_ok, stride_om, stride_on, SWAP, ROUTE_WEIGHT)


_LOCK_ENTRIES = 1 << 16
_locks: dict[tuple[str, int], list[torch.Tensor]] = {}
_locks_guard = threading.Lock()


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The zeroed int32 counters of the current stream on ``device`` (module note), at least ``tiles`` long.

    Buffers are never freed (a CUDA graph may hold a replaced one's address) and never made while the stream
    captures a graph: a capturing stream's buffer comes from :func:`reserve_tile_counters`, and asking more of
    it raises ``RuntimeError``.

    NOTE: made inside a capture, the zeroing would be a node of that graph: the buffer would hold whatever the
    graph pool's memory held until the graph's first replay, for every launch on the stream meanwhile (issue
    44: the eager passes before a decode graph's capture counted from garbage, every row's logits non-finite)."""
    if device.type == "cuda":  # keyed by index: "cuda" and "cuda:0" name one device's streams
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (f"cuda:{index}", torch.cuda.current_stream(index).cuda_stream)
    else:
        key = (str(device), 0)
    with _locks_guard:
        held = _locks.setdefault(key, [])
        if not held or held[-1].numel() < tiles:
            if capturing(device):
                raise RuntimeError(f"a CUDA graph captured on {device} needs split-K counters for {tiles} tiles, "
                                   f"{held[-1].numel() if held else 0} were reserved (reserve_tile_counters first)")
            held.append(torch.zeros(max(_LOCK_ENTRIES, tiles), dtype=torch.int32, device=device))
        return held[-1]


def reserve_tile_counters(device: torch.device, tiles: int = _LOCK_ENTRIES) -> None:
    """Make (and zero, now) the current stream's counters on ``device`` for ``tiles`` tiles: before CUDA graphs
    are captured on that stream (:func:`tile_counters`)."""
    tile_counters(device, tiles)


def _launch(a: torch.Tensor, weight: Q8_0Stack, align: MoeAlignment, top_k: int, tiles: DecodeTiles,
            n_out: int, up_offset: int, *, gather_rows: bool, glu: bool,
            top_weight: torch.Tensor | None) -> torch.Tensor:
    qs, scales = weight.qs, weight.scales
    k_in = qs.shape[2]
    if a.shape[-1] != k_in:
        raise ValueError(f"activations have {a.shape[-1]} features, the experts take {k_in}")
    if tiles.block_k % QBLOCK or k_in % tiles.block_k:
        raise ValueError(f"the K step {tiles.block_k} must be a multiple of {QBLOCK} dividing {k_in}")
    if tiles.wide and tiles.block_k // QBLOCK not in (1, 2, 4, 8):
        raise ValueError(f"a wide TMA box takes a K step of 32, 64, 128 or 256, got {tiles.block_k}")
    if tiles.split_k < 1:
        raise ValueError(f"split_k must be at least 1, got {tiles.split_k}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out
    n_tiles = cdiv(n_out, tiles.block_n)
    split = tiles.split_k
    if split > 1:
        planes = split * (2 if glu else 1)
        partials = torch.empty((planes, num_slots, n_out), dtype=torch.float32, device=a.device)
        counters = tile_counters(a.device, num_blocks * n_tiles)
    else:
        partials, counters = out, align.num_valid_blocks  # unused
    grid = (num_blocks * n_tiles * split,)
    q_desc: object = qs
    # TMA reads the stack as one (E * out, in) matrix: contiguous, 16-byte aligned (else per-thread loads)
    # (Hopper and later have it; Triton's interpreter runs descriptors on the host too)
    has_tma = a.device.type != "cuda" or hopper_or_later(a.device)
    tma = tiles.tma and has_tma and qs.is_contiguous() and qs.data_ptr() % 16 == 0
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        box_k = tiles.block_k if tiles.wide else QBLOCK
        q_desc = TensorDescriptor.from_tensor(qs.reshape(-1, k_in), block_shape=[tiles.block_n, box_k])
    with launch_device(a):
        _decode_gemm_kernel[grid](
            a, qs, q_desc, scales, out, route, partials, counters,
            align.sorted_slots, align.block_expert, align.num_valid_blocks,
            n_out, k_in, num_slots, top_k, up_offset, qs.shape[1],
            a.stride(0), a.stride(1), qs.stride(0), qs.stride(1), qs.stride(2),
            scales.stride(0), scales.stride(1), scales.stride(2), out.stride(0), out.stride(1),
            GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None,
            BF16=a.device.type == "cuda" and a.dtype == torch.bfloat16, GLU=glu, SWAP=tiles.swap, SPLIT_K=split,
            TMA=tma, WIDE=tma and tiles.wide,
            BLOCK_M=align.block_m, BLOCK_N=tiles.block_n, GROUPS=tiles.block_k // QBLOCK,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, **dependent_launch(a),
        )
    return out


def decode_gemm(a: torch.Tensor, weight: Q8_0Stack, align: MoeAlignment, top_k: int, tiles: DecodeTiles, *,
                gather_rows: bool, top_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Per-slot ``(S, out)`` rows of ``A[row(s)] @ W[expert(s)].T`` for a Q8_0 stack (module doc)."""
    return _launch(a, weight, align, top_k, tiles, weight.qs.shape[1], 0, gather_rows=gather_rows, glu=False,
                   top_weight=top_weight)


def decode_gemm_glu(a: torch.Tensor, weight: Q8_0Stack, align: MoeAlignment, top_k: int, tiles: DecodeTiles, *,
                    gather_rows: bool) -> torch.Tensor:
    """Per-slot ``(S, I)`` rows of ``silu(A[row(s)] @ G.T) * (A[row(s)] @ U.T)`` for a fused ``(E, 2I, in)``
    gate/up stack (gate rows then up rows): :func:`decode_gemm` followed by ``silu_mul``, in one launch and
    bit for bit the same (module doc)."""
    two_i = weight.qs.shape[1]
    if two_i % 2:
        raise ValueError(f"a fused gate/up weight has an even number of rows, got {two_i}")
    return _launch(a, weight, align, top_k, tiles, two_i // 2, two_i // 2, gather_rows=gather_rows, glu=True,
                   top_weight=None)
