"""The SwiGLU experts of a MoE layer on the Triton path: align, two GEMMs, SiLU·up, a fixed-order sum.

:func:`grouped_swiglu_experts` computes ``sum_k w_k * down_e(silu(gate_e(x)) * up_e(x))`` (+ residual)
for routed tokens: the slots are sorted into one-expert blocks on the device
(:mod:`stagewise.kernels.moe_align`, :mod:`~stagewise.kernels.moe_align_triton`), then either

* the grouped GEMM (:mod:`stagewise.kernels.moe_grouped_triton`: prefill, and a packed stack beside a
  dense or Q8_0 one) twice,
  SiLU·up between them and the routing weights applied in the down GEMM, summed over ``K`` in a
  fixed order; or
* for Q8_0 stacks at decode sizes (:data:`~stagewise.kernels.moe_decode_triton.DECODE_Q8_0`), the
  few-rows decode GEMM (:mod:`stagewise.kernels.moe_decode_triton`) with SiLU·up fused into gate_up,
  and the decode path's weighted combine;
* for packed stacks (any packed types, each its own; :class:`PackedExpertsConfig`), the same with the
  packed few-rows GEMM (:mod:`stagewise.kernels.packed_decode_triton`): kernel A's 16-row blocks at
  decode sizes, kernel B's 64-row blocks at prefill sizes (each weight value converted once per block,
  3-4x the grouped GEMM's dequantized tiles at 32-64 rows: ``bench/results/kquant_profile``).

No atomics (deterministic), shape-only sizes and no host synchronization (CUDA-graph capturable). The
config is a function of the slot count, the expert count, the stacks' formats and the device kind,
never of the routing. Numerics differ from the per-expert loop of
:class:`~stagewise.models.layers.experts.Experts` only in float32 accumulation order and in applying
the routing weight before the output is rounded (allclose, not bit-equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.kernels.expert_stacks import ExpertWeight, PackedStack, as_packed, is_q8_0, stack_shape
from stagewise.kernels.kernel_variants import int_class
from stagewise.kernels.moe_align import align_capacity, moe_align
from stagewise.kernels.moe_align_triton import MAX_FUSED_SLOTS, moe_align_fused
from stagewise.kernels.moe_decode_triton import DECODE_Q8_0, DecodeConfig, decode_gemm, decode_gemm_glu
from stagewise.kernels.moe_grouped_triton import (
    INTERPRETER,
    TILES_64,
    TILES_64_Q8_0_GATE_UP,
    TILES_128,
    GroupedConfig,
    grouped_gemm,
    packed_tiles,
)
from stagewise.kernels.moe_route_triton import add_gated_shared, combine
from stagewise.kernels.packed_decode_triton import PackedTiles, packed_decode_gemm, packed_decode_gemm_glu
from stagewise.kernels.packed_matmul import expert_tiles
from stagewise.kernels.silu_mul_triton import silu_mul

DECODE_SLOTS_PER_EXPERT = 4  # up to this many routed slots per expert (on average): the decode kernels


PREFILL_BLOCK_M = 64  # kernel B's expert blocks (128 rows with SiLU·up fused need 255 registers at sm_90a)


@dataclass(frozen=True)
class PackedExpertsConfig:
    """Experts of packed stacks in ``block_m``-row one-expert blocks through the packed few-rows GEMM (kernel A
    or B, as the tiles say), SiLU·up fused into gate_up, the slots summed by the decode path's combine."""

    block_m: int
    gate_up: PackedTiles
    down: PackedTiles


def packed_experts_config(gate_up: PackedStack, down: PackedStack, num_slots: int, num_experts: int,
                          device: torch.device) -> PackedExpertsConfig:
    """Kernel A's 16-row blocks up to :data:`DECODE_SLOTS_PER_EXPERT` routed slots per expert on average, kernel
    B's :data:`PREFILL_BLOCK_M`-row blocks beyond (16-row blocks in Triton's interpreter): a function of the slot
    and expert counts, the stacks' types, K and the device kind."""
    decode = num_slots <= DECODE_SLOTS_PER_EXPERT * num_experts
    block_m = 16 if decode or device.type != "cuda" else PREFILL_BLOCK_M
    return PackedExpertsConfig(block_m, expert_tiles(gate_up.ggml_type, gate_up.in_features, device, scale_after=decode),
                               expert_tiles(down.ggml_type, down.in_features, device, scale_after=decode))


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
    if gate_up_q8_0 and down_q8_0 and num_slots <= DECODE_SLOTS_PER_EXPERT * num_experts:
        return DECODE_Q8_0
    return GroupedConfig(64, TILES_64_Q8_0_GATE_UP if gate_up_q8_0 else TILES_64, TILES_64)


def packed_config(device: torch.device, gate_up: PackedStack | None, down: PackedStack | None,
                  num_slots: int, num_experts: int) -> GroupedConfig:
    """The grouped config when either stack is packed (the other dense or Q8_0 takes the same tiles)."""
    block_m = 16 if device.type != "cuda" else (128 if num_slots >= 64 * num_experts else 64)
    hidden = gate_up.in_features if gate_up is not None else (down.qs.shape[1] if down is not None else 0)
    inter = down.in_features if down is not None else 0
    return GroupedConfig(block_m, packed_tiles(device, gate_up, hidden or 256), packed_tiles(device, down, inter or 256))


def experts_config(num_slots: int, gate_up: ExpertWeight, down: ExpertWeight,
                   device: torch.device) -> GroupedConfig | DecodeConfig | PackedExpertsConfig:
    """The kernels and tiles :func:`grouped_swiglu_experts` takes for ``num_slots`` routed slots: a function
    of the slots, the stacks' formats and shapes, and the device kind (never of the routing)."""
    experts = stack_shape(gate_up)[0]
    gate_packed, down_packed = as_packed(gate_up), as_packed(down)
    if gate_packed is not None and down_packed is not None:
        return packed_experts_config(gate_packed, down_packed, num_slots, experts, device)
    if gate_packed is not None or down_packed is not None:  # NOTE: a packed stack beside a dense or Q8_0 one
        # (no file mixes them): the grouped GEMM
        return packed_config(device, gate_packed, down_packed, num_slots, experts)
    return default_config(num_slots, experts, device, is_q8_0(gate_up), is_q8_0(down))


def launch_classes(num_slots: int, gate_up: ExpertWeight, down: ExpertWeight, device: torch.device) -> tuple[object, ...]:
    """What of :func:`grouped_swiglu_experts`' launches for ``num_slots`` routed slots Triton specializes on
    (:mod:`~stagewise.kernels.kernel_variants`) and only the slot count decides: the config, the alignment's
    kernel, and the classes of the slot and block counts the kernels take. Two slot counts with equal
    classes launch the same compiled kernels (what warm-up covers)."""
    cfg = experts_config(num_slots, gate_up, down, device)
    capacity = align_capacity(num_slots, stack_shape(gate_up)[0], cfg.block_m)
    return (repr(cfg), num_slots <= MAX_FUSED_SLOTS, int_class(num_slots), int_class(capacity // cfg.block_m),
            int_class(capacity))


def grouped_swiglu_experts(x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor,
                           gate_up: ExpertWeight, down: ExpertWeight,
                           config: GroupedConfig | DecodeConfig | PackedExpertsConfig | None = None,
                           residual: torch.Tensor | None = None,
                           shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """``sum_k top_weight[n, k] * expert_{top_index[n, k]}(x[n])`` ``(N, H)`` in ``x``'s dtype; with ``shared``
    (a shared expert's output ``(N, H)`` and gate logit ``(N, 1)``) then ``+ sigmoid(g) * shared``
    (:func:`~stagewise.kernels.moe_route_triton.combine`'s rounding); plus ``residual`` ``(N, H)`` when given
    (with the rounding of a separate add).

    ``x`` ``(N, H)``; ``top_index``/``top_weight`` ``(N, K)``; ``gate_up`` ``(E, 2I, H)`` (gate rows then
    up rows) and ``down`` ``(E, H, I)``, each dense, Q8_0 or packed. No host synchronization.
    """
    tokens, top_k = top_index.shape
    experts, _, hidden = stack_shape(gate_up)
    if x.shape != (tokens, hidden):
        raise ValueError(f"x {tuple(x.shape)} does not match {tokens} tokens of {hidden} features")
    if tokens == 0:
        return x.new_zeros((0, hidden))
    gate_packed, down_packed = as_packed(gate_up), as_packed(down)
    cfg = config or experts_config(tokens * top_k, gate_up, down, x.device)
    if tokens * top_k <= MAX_FUSED_SLOTS:
        align = moe_align_fused(top_index, experts, cfg.block_m)  # one launch (batched decode)
    else:
        align = moe_align(top_index, experts, cfg.block_m)
    if isinstance(cfg, PackedExpertsConfig):
        if gate_packed is None or down_packed is None:
            raise ValueError("the packed experts config takes packed stacks only")
        act = packed_decode_gemm_glu(x, gate_packed, align, top_k, cfg.gate_up, gather_rows=True)  # (S, I)
        y = packed_decode_gemm(act, down_packed, align, top_k, cfg.down, gather_rows=False)  # (S, H)
        return combine(y, top_weight, x.dtype, residual, shared)
    if isinstance(cfg, DecodeConfig):
        if not (is_q8_0(gate_up) and is_q8_0(down)):
            raise ValueError("the decode experts' kernels take Q8_0 stacks only")
        if cfg.fuse_silu:
            act = decode_gemm_glu(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True)  # (S, I) silu(gate)*up
        else:
            act = silu_mul(decode_gemm(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True))
        y = decode_gemm(act, down, align, top_k, cfg.down, gather_rows=False)  # (S, H)
        return combine(y, top_weight, x.dtype, residual, shared)  # weighted sum over K (+ residual), one launch
    h = grouped_gemm(x, gate_up, align, top_k, cfg.gate_up, gather_rows=True)  # (S, 2I) per slot
    act = silu_mul(h)  # (S, I) silu(gate) * up, one launch
    y = grouped_gemm(act, down, align, top_k, cfg.down, gather_rows=False, top_weight=top_weight)  # (S, H)
    out = y.view(tokens, top_k, -1).sum(dim=1).to(x.dtype)  # a fixed-order sum over K: deterministic
    if shared is not None:
        return add_gated_shared(out, *shared, residual)
    return out if residual is None else out + residual
