"""Grouped MoE GEMM (Triton) and the SwiGLU experts built on it: the prefill path of a MoE layer.

Contract. After :func:`~stagewise.kernels.moe_align.moe_align` has sorted the ``S = N * K`` routed
slots (``slot = token * K + k``) into ``BLOCK_M``-row blocks of one expert each,
:func:`grouped_gemm` computes for every slot ``s``

    ``out[s] = A[row(s)] @ W[expert(s)].T`` (times ``top_weight.flatten()[s]`` when ``route_weight``)

where ``row(s) = s // K`` when ``gather_rows`` (A is the tokens' ``x (N, in)``) and ``row(s) = s``
otherwise (A is already per slot, ``(S, in)``). ``W`` is a dense stack ``(E, out, in)`` (bf16 / f16 /
f32) or Q8_0 (``qs`` int8 ``(E, out, in)`` + ``scales`` f16 ``(E, out, in / 32)``; value = ``qs *
scale`` of its 32-element block). One program owns ``BLOCK_M`` sorted slots x ``BLOCK_N`` outputs;
it dequantizes each weight tile in registers exactly as :class:`~stagewise.weights.quant.q8_0.Q8_0Weight`
does (``(qs * scale)`` in float32, rounded to the activation dtype), feeds ``tl.dot`` and accumulates
in float32. Programs past the valid blocks return at once; rows of padding slots are never written.

:func:`grouped_swiglu_experts` is the whole experts computation, ``sum_k w_k * down_e(silu(gate_e(x))
* up_e(x))``, in one align + two grouped GEMMs + SiLU*up + a fixed-order sum over ``K`` (no atomics:
deterministic). Everything stays on the device with shape-only sizes: no host synchronization, so it
is CUDA-graph capturable. Numerics differ from the per-expert loop of
:class:`~stagewise.models.layers.experts.Experts` only in float32 accumulation order and in applying
the routing weight before the output is rounded (allclose, not bit-equal).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

from stagewise.kernels.moe_align import MoeAlignment, moe_align
from stagewise.kernels.moe_align_triton import MAX_FUSED_SLOTS, moe_align_fused
from stagewise.kernels.moe_decode_triton import DecodeTiles, decode_gemm, decode_gemm_glu
from stagewise.kernels.packed_blocks_triton import block_values
from stagewise.kernels.silu_mul_triton import silu_mul
from stagewise.kernels.triton_launch import launch_device
from stagewise.weights.quant.packed_types import block_elements

QBLOCK = 32  # elements per Q8_0 block: BLOCK_K must be a multiple of it


@runtime_checkable
class Q8_0Stack(Protocol):
    """What the kernel reads of a Q8_0 stack (``Q8_0Weight`` is one): int8 ``qs`` ``(E, out, in)`` and f16
    ``scales`` ``(E, out, in / 32)``."""

    @property
    def qs(self) -> torch.Tensor: ...

    @property
    def scales(self) -> torch.Tensor: ...


class Q8_0Tensors(NamedTuple):
    """A Q8_0 stack as bare tensors."""

    qs: torch.Tensor
    scales: torch.Tensor


@runtime_checkable
class PackedStack(Protocol):
    """What the kernel reads of any other packed stack (``PackedWeight`` is one): the GGUF rows
    ``raw`` uint8 ``(E, out, row_bytes)`` of ``in_features`` values of ``ggml_type``."""

    @property
    def raw(self) -> torch.Tensor: ...

    @property
    def ggml_type(self) -> GGMLQuantizationType: ...

    @property
    def in_features(self) -> int: ...


class PackedTensors(NamedTuple):
    """A packed stack as bare values."""

    raw: torch.Tensor
    ggml_type: GGMLQuantizationType
    in_features: int


ExpertWeight = torch.Tensor | Q8_0Stack | PackedStack  # (E, out, in) dense, the Q8_0 stack, or packed blocks


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr, route_ptr,
    sorted_ptr, block_expert_ptr, valid_ptr,
    N, K, num_slots, top_k, num_blocks,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk,
    stride_se, stride_sn, stride_sk, stride_om, stride_on,
    GATHER_ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, Q8_0: tl.constexpr, EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PACKED: tl.constexpr = 0,
):
    # PACKED: a ggml type id (0: none): w_ptr holds each row's GGUF blocks, dequantized a K step at a time
    # grouped program order: GROUP_M row blocks walk the N tiles together (weight tiles stay in L2)
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(num_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_rows
    pid_n = (pid % in_group) // group_rows
    if pid_m >= tl.load(valid_ptr):
        return  # a padding block past every expert's run
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ptr + offs_m)  # (BM,) the capacity is a whole number of blocks
    row_ok = slots < num_slots
    if GATHER_ROWS:
        rows = slots // top_k
    else:
        rows = slots
    rows = tl.where(row_ok, rows, 0).to(tl.int64)  # (BM,) padding reads row 0 (masked anyway)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BM, BK)
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None] * stride_wk
    s_row = s_ptr + expert * stride_se + offs_n[None, :].to(tl.int64) * stride_sn  # (1, BN): this K step's 1st block
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    packed_rows = w_ptr + expert * stride_we + offs_n.to(tl.int64) * stride_wn  # (BN,) row starts (PACKED)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        if PACKED != 0:  # the K step's blocks dequantized in registers, (BK, BN) in the activation dtype
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.trans(block_values(packed_rows, k0 * BLOCK_K, K, n_ok, PACKED, BLOCK_N, BLOCK_K)).to(a.dtype)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :], other=0)  # (BK, BN)
        else:
            k_ok = offs_k < K - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        if Q8_0 and PACKED == 0:
            # the (BK/32, BN) scales of this K step, each repeated over its 32 rows: one load per scale
            # (measured 1.4-1.6x faster on an H200 than gathering a (BK, BN) tile of scale addresses)
            groups = tl.arange(0, BLOCK_K // 32)
            g_ok = groups < (K - k0 * BLOCK_K + 31) // 32
            sg = tl.load(s_row + groups[:, None] * stride_sk, mask=g_ok[:, None] & n_ok[None, :], other=0.0)
            s = tl.reshape(tl.broadcast_to(sg[:, None, :], (BLOCK_K // 32, 32, BLOCK_N)), (BLOCK_K, BLOCK_N))
            w = (w.to(tl.float32) * s.to(tl.float32)).to(a.dtype)  # as Q8_0Weight dequantizes
        elif PACKED == 0:
            w = w.to(a.dtype)
        if UPCAST:  # NOTE: the interpreter holds bf16 as raw uint16 and multiplies it wrongly
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
        s_row += (BLOCK_K // 32) * stride_sk
    if ROUTE_WEIGHT:
        route = tl.load(route_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)  # (BM,)
        acc = acc * route[:, None]
    out_ptrs = out_ptr + slots[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class GemmTiles:
    """Tile shape and launch settings of one grouped GEMM (``BLOCK_M`` is the alignment's)."""

    block_n: int
    block_k: int  # a multiple of 32 (one Q8_0 block)
    num_warps: int
    num_stages: int
    group_m: int = 8


@dataclass(frozen=True)
class GroupedConfig:
    """``block_m`` (shared: one alignment feeds both GEMMs) and the tiles of each grouped GEMM."""

    block_m: int
    gate_up: GemmTiles
    down: GemmTiles


@dataclass(frozen=True)
class DecodeConfig:
    """Batched-decode experts of Q8_0 stacks: ``block_m``-row blocks through
    :mod:`stagewise.kernels.moe_decode_triton` (scale after each block's dot, SiLU·up fused into the
    gate_up GEMM) and the slots summed by the decode path's combine."""

    block_m: int
    gate_up: DecodeTiles
    down: DecodeTiles
    fuse_silu: bool = True  # SiLU·up in the gate_up GEMM's epilogue (else a separate silu_mul launch)


# H200 defaults, from `bench/moe_grouped.py --sweep` (Qwen3-30B-A3B and Qwen3.6-35B-A3B experts, 512 and
# 2048 tokens): 64-row blocks, 128-row blocks once experts average >= 64 slots; the Q8_0 gate_up GEMM
# prefers the wider K step (its dequantization is amortized over more of each dot); 16/32-row blocks
# measured 1.5-2x slower
TILES_64 = GemmTiles(block_n=128, block_k=64, num_warps=4, num_stages=4)
TILES_64_Q8_0_GATE_UP = GemmTiles(block_n=128, block_k=128, num_warps=8, num_stages=3)
TILES_128 = GemmTiles(block_n=128, block_k=64, num_warps=8, num_stages=3)
# batched decode (at most 4 routed slots per expert on average, Q8_0): 16-row blocks, narrow tiles, more
# programs; `bench/moe_grouped.py --sweep --tokens 4,8,16,32,64` on an H200 (moe_decode_sweep_h200.json):
# 32 tokens of Qwen3-30B-A3B 0.67 ms vs 0.93 ms with the 64-row prefill tiles (eager, launches included)
TILES_DECODE = GemmTiles(block_n=64, block_k=128, num_warps=2, num_stages=4)
# the decode kernels' tiles (moe_decode_triton), fastest of `bench/q8_0_decode_sweep.py` and `bench/q8_0_decode_wide_ab.py`
# on an H200 at 32 sequences of Qwen3-30B-A3B (q8_0_decode_wide_tma2_h200.json): weights on the dot's tall side (swap),
# by TMA in one box a K step (wide); gate_up with SiLU·up fused, 32 rows a program, 128-wide K steps in three stages;
# down (K = 768) 64 rows, 64-wide K steps in three stages. 103.9 / 51.3 us (3.6 / 3.6 TB/s) against 118.3 / 55.5 us with
# one box a 32-column group (the tiles before: 64 rows for gate_up, two stages)
DECODE_Q8_0 = DecodeConfig(16, DecodeTiles(32, 128, 2, 3, swap=True, tma=True, wide=True),
                           DecodeTiles(64, 64, 2, 3, swap=True, tma=True, wide=True))
# small tiles for Triton's interpreter (tests on CPU)
INTERPRETER = GroupedConfig(16, GemmTiles(32, 32, 4, 1, 2), GemmTiles(32, 32, 4, 1, 2))


def default_config(num_slots: int, num_experts: int, device: torch.device,
                   gate_up_q8_0: bool = False, down_q8_0: bool = False) -> GroupedConfig | DecodeConfig:
    """Tiles for ``num_slots`` routed slots over ``num_experts``: a function of the shapes, the gate_up
    weight's format and the device kind only (never of the routing).

    Off CUDA the kernels can only run in Triton's interpreter (tests): the small tiles keep it fast.
    """
    if device.type != "cuda":
        return INTERPRETER
    if num_slots >= 64 * num_experts:
        return GroupedConfig(128, TILES_128, TILES_128)
    if gate_up_q8_0 and down_q8_0 and num_slots <= 4 * num_experts:
        return DECODE_Q8_0
    return GroupedConfig(64, TILES_64_Q8_0_GATE_UP if gate_up_q8_0 else TILES_64, TILES_64)


# packed stacks: a K step of 256 values (a K-quant super-block; eight 32-value blocks otherwise),
# NOTE: unmeasured defaults (bench/moe_grouped.py measures); BLOCK_K must divide K
TILES_PACKED = GemmTiles(block_n=64, block_k=256, num_warps=8, num_stages=2)
INTERPRETER_PACKED = GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=1, group_m=2)


def packed_tiles(device: torch.device, weight: PackedStack | None, k: int) -> GemmTiles:
    """Tiles of a grouped GEMM over a packed stack: a function of the device kind, type and K only."""
    tiles = TILES_PACKED if device.type == "cuda" else INTERPRETER_PACKED
    step = tiles.block_k
    while step > 32 and (k % step or (weight is not None and step < block_elements(weight.ggml_type))):
        step //= 2
    return dataclasses.replace(tiles, block_k=step)


def packed_config(device: torch.device, gate_up: PackedStack | None, down: PackedStack | None,
                  num_slots: int, num_experts: int) -> GroupedConfig:
    """The grouped config when either stack is packed (the other dense or Q8_0 takes the same tiles)."""
    block_m = 16 if device.type != "cuda" else (128 if num_slots >= 64 * num_experts else 64)
    hidden = gate_up.in_features if gate_up is not None else (down.raw.shape[1] if down is not None else 0)
    inter = down.in_features if down is not None else 0
    return GroupedConfig(block_m, packed_tiles(device, gate_up, hidden or 256), packed_tiles(device, down, inter or 256))


def _stack(weight: ExpertWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(values, scales)``: a dense stack has no scales (a packed stack: see :func:`_packed`)."""
    if isinstance(weight, torch.Tensor):
        return weight, None
    if isinstance(weight, Q8_0Stack):
        return weight.qs, weight.scales
    raise TypeError(f"grouped MoE GEMM takes a dense tensor or a Q8_0 stack, not {type(weight).__name__}")


def _packed(weight: ExpertWeight) -> PackedStack | None:
    if isinstance(weight, torch.Tensor) or isinstance(weight, Q8_0Stack) or not isinstance(weight, PackedStack):
        return None
    return weight


def _shape(weight: ExpertWeight) -> tuple[int, int, int]:
    """``(E, out, in)`` of any stack."""
    packed = _packed(weight)
    if packed is not None:
        e, n, _ = packed.raw.shape
        return e, n, packed.in_features
    values, _ = _stack(weight)
    e, n, k = values.shape
    return e, n, k


def grouped_gemm(a: torch.Tensor, weight: ExpertWeight, align: MoeAlignment, top_k: int, tiles: GemmTiles, *,
                 gather_rows: bool, top_weight: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-slot ``(S, out)`` rows of ``A[row(s)] @ W[expert(s)].T`` (see the module doc).

    ``a``: ``(N, in)`` when ``gather_rows`` (row ``s // top_k``), else ``(S, in)`` (row ``s``).
    ``top_weight`` ``(N, K)``, if given, scales row ``s`` by ``top_weight.flatten()[s]``.
    """
    packed = _packed(weight)
    if packed is not None:
        values, scales = packed.raw, None
        if tiles.block_k % block_elements(packed.ggml_type) or packed.in_features % tiles.block_k:
            raise ValueError(f"{packed.ggml_type.name}: BLOCK_K {tiles.block_k} must divide K and hold whole blocks")
    else:
        values, scales = _stack(weight)
    _, n_out, k_in = _shape(weight)
    if a.shape[-1] != k_in:
        raise ValueError(f"activations have {a.shape[-1]} features, the experts take {k_in}")
    if scales is not None and tiles.block_k % QBLOCK:
        raise ValueError(f"Q8_0 needs BLOCK_K a multiple of {QBLOCK}, got {tiles.block_k}")
    num_slots = align.num_slots
    out = torch.empty((num_slots, n_out), dtype=out_dtype or a.dtype, device=a.device)  # (S, out)
    num_blocks = align.block_expert.numel()
    if num_slots == 0 or num_blocks == 0:
        return out
    route = top_weight.reshape(-1).contiguous() if top_weight is not None else out  # (S,), unused if None
    s_ptr = scales if scales is not None else values  # unused for a dense stack
    s_strides = scales.stride() if scales is not None else (0, 0, 0)
    grid = (num_blocks * triton.cdiv(n_out, tiles.block_n),)
    with launch_device(a):
        _grouped_gemm_kernel[grid](
            a, values, s_ptr, out, route,
            align.sorted_slots, align.block_expert, align.num_valid_blocks,
            n_out, k_in, num_slots, top_k, num_blocks,
            a.stride(0), a.stride(1), values.stride(0), values.stride(1), 1 if packed is not None else values.stride(2),
            s_strides[0], s_strides[1], s_strides[2], out.stride(0), out.stride(1),
            GATHER_ROWS=gather_rows, ROUTE_WEIGHT=top_weight is not None, Q8_0=scales is not None,
            EVEN_K=k_in % tiles.block_k == 0, UPCAST=a.device.type != "cuda",  # off CUDA: the interpreter
            BLOCK_M=align.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
            PACKED=int(packed.ggml_type) if packed is not None else 0,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return out


def grouped_swiglu_experts(x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor,
                           gate_up: ExpertWeight, down: ExpertWeight,
                           config: GroupedConfig | DecodeConfig | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_k top_weight[n, k] * expert_{top_index[n, k]}(x[n])`` ``(N, H)`` in ``x``'s dtype, plus
    ``residual`` ``(N, H)`` when given (with the rounding of a separate add).

    ``x`` ``(N, H)``; ``top_index``/``top_weight`` ``(N, K)``; ``gate_up`` ``(E, 2I, H)`` (gate rows then
    up rows) and ``down`` ``(E, H, I)``, each dense or Q8_0. No host synchronization.
    """
    tokens, top_k = top_index.shape
    experts, _, hidden = _shape(gate_up)
    if x.shape != (tokens, hidden):
        raise ValueError(f"x {tuple(x.shape)} does not match {tokens} tokens of {hidden} features")
    if tokens == 0:
        return x.new_zeros((0, hidden))
    if config is None and (_packed(gate_up) is not None or _packed(down) is not None):
        config = packed_config(x.device, _packed(gate_up), _packed(down), tokens * top_k, experts)
    cfg = config or default_config(tokens * top_k, experts, x.device, isinstance(gate_up, Q8_0Stack),
                                   isinstance(down, Q8_0Stack))
    if tokens * top_k <= MAX_FUSED_SLOTS:
        align = moe_align_fused(top_index, experts, cfg.block_m)  # one launch (batched decode)
    else:
        align = moe_align(top_index, experts, cfg.block_m)
    if isinstance(cfg, DecodeConfig):
        if not (isinstance(gate_up, Q8_0Stack) and isinstance(down, Q8_0Stack)):
            raise ValueError("the decode experts' kernels take Q8_0 stacks only")
        from stagewise.kernels.moe_route_triton import combine

        if cfg.fuse_silu:
            act = decode_gemm_glu(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True)  # (S, I) silu(gate)*up
        else:
            act = silu_mul(decode_gemm(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True))
        y = decode_gemm(act, down, align, top_k, cfg.down, gather_rows=False)  # (S, H)
        return combine(y, top_weight, x.dtype, residual)  # weighted sum over K (+ residual), one launch
    h = grouped_gemm(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True)  # (S, 2I) per slot
    act = silu_mul(h)  # (S, I) silu(gate) * up, one launch
    y = grouped_gemm(act, down, align, top_k, cfg.down, gather_rows=False, top_weight=top_weight)  # (S, H)
    out = y.view(tokens, top_k, -1).sum(dim=1).to(x.dtype)  # a fixed-order sum over K: deterministic
    return out if residual is None else out + residual
