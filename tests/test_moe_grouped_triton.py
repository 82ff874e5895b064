"""Grouped MoE GEMM: the alignment's invariants, the kernel against a float32 reference (dense and
Q8_0), and the whole SwiGLU experts against the per-expert loop of ``Experts``. On a machine with a
GPU the tensors live there and the kernels run compiled; without one they are CPU tensors run by
Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

pytest.importorskip("triton")

from stagewise.kernels.moe_align import align_capacity, moe_align
from stagewise.kernels.moe_decode_triton import DecodeTiles
from stagewise.kernels.moe_experts import grouped_swiglu_experts
from stagewise.kernels.moe_grouped_triton import INTERPRETER, GemmTiles, GroupedConfig, grouped_gemm
from stagewise.kernels.silu_mul_triton import silu_mul
from stagewise.models.layers.experts import Experts
from stagewise.weights.quant.q8_0 import Q8_0Weight

E, K, H = 8, 2, 64
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _routing(tokens: int, experts: int, k: int, seed: int, skip: tuple[int, ...] = ()) -> torch.Tensor:
    """``(tokens, k)`` distinct experts per token, never one of ``skip`` (unused experts)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=g)
    scores[:, list(skip)] = -1.0
    return torch.topk(scores, k, dim=-1).indices.to(DEVICE)  # (N, K) int64


def _quantize(w: torch.Tensor) -> Q8_0Weight:
    blocks = w.float().unflatten(-1, (-1, 32))
    scale = (blocks.abs().amax(-1).clamp(min=1e-8) / 127.0).to(torch.float16)
    qs = torch.round(blocks / scale.float()[..., None]).clamp(-127, 127).to(torch.int8).flatten(-2)
    return Q8_0Weight(qs.contiguous(), scale.contiguous())


@pytest.mark.parametrize(("tokens", "experts", "k", "block_m"), [(5, 8, 2, 4), (40, 8, 2, 16), (33, 16, 3, 8),
                                                                 (1, 8, 1, 16), (7, 4, 4, 1)])
def test_align_invariants(tokens: int, experts: int, k: int, block_m: int) -> None:
    top_index = _routing(tokens, experts, k, seed=tokens, skip=(1,) if experts > k + 1 else ())
    align = moe_align(top_index, experts, block_m)
    slots = tokens * k
    capacity = align_capacity(slots, experts, block_m)
    assert align.sorted_slots.dtype == torch.int32 and align.sorted_slots.shape == (capacity,)
    assert capacity % block_m == 0 and align.block_expert.shape == (capacity // block_m,)
    assert align.num_slots == slots and align.block_m == block_m
    sorted_slots = align.sorted_slots.tolist()
    real = [s for s in sorted_slots if s != slots]
    assert sorted(real) == list(range(slots))  # every slot exactly once; padding is the sentinel S
    assert all(0 <= s <= slots for s in sorted_slots)
    flat = top_index.reshape(-1).tolist()
    valid = int(align.num_valid_blocks.item())
    counts = [flat.count(e) for e in range(experts)]
    assert valid == sum(-(-c // block_m) for c in counts)
    blocks = [sorted_slots[b * block_m : (b + 1) * block_m] for b in range(capacity // block_m)]
    block_expert = align.block_expert.tolist()
    seen: list[int] = []
    for b, block in enumerate(blocks):
        if b >= valid:
            assert block_expert[b] == -1 and all(s == slots for s in block)
            continue
        e = block_expert[b]
        assert any(s != slots for s in block)  # a valid block is never all padding
        assert all(flat[s] == e for s in block if s != slots)  # one expert per block
        real_in = [s for s in block if s != slots]
        assert block[: len(real_in)] == real_in  # padding only at the end of a run
        seen.extend(real_in)
    # experts ascending, each expert's slots contiguous and in ascending slot order (stable)
    assert seen == sorted(range(slots), key=lambda s: (flat[s], s))
    assert block_expert[:valid] == sorted(block_expert[:valid])
    again = moe_align(top_index, experts, block_m)
    assert all(torch.equal(a, b) for a, b in zip(align[:3], again[:3], strict=True))


def _reference(a: torch.Tensor, w: torch.Tensor, top_index: torch.Tensor, gather_rows: bool,
               top_weight: torch.Tensor | None) -> torch.Tensor:
    """float32 ``out[s] = A[row(s)] @ W[e(s)].T (* weight[s])`` with W already dequantized."""
    k = top_index.shape[1]
    flat = top_index.reshape(-1)
    rows = torch.arange(flat.numel(), device=DEVICE) // (k if gather_rows else 1)
    out = torch.einsum("si,soi->so", a.float()[rows], w.float()[flat])
    if top_weight is not None:
        out = out * top_weight.reshape(-1, 1).float()
    return out


TILES = GemmTiles(block_n=32, block_k=32, num_warps=4, num_stages=1, group_m=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q8", [False, True], ids=["dense", "q8_0"])
@pytest.mark.parametrize("gather_rows", [True, False], ids=["gather", "per_slot"])
def test_grouped_gemm_matches_reference(dtype: torch.dtype, q8: bool, gather_rows: bool) -> None:
    torch.manual_seed(0)
    tokens, n_out, k_in = 21, 48, 96  # n_out not a multiple of BLOCK_N 32, k_in not of BLOCK_K 64 or 128
    top_index = _routing(tokens, E, K, seed=3, skip=(5,))
    top_weight = torch.rand(tokens, K).to(DEVICE, dtype)
    w = torch.randn(E, n_out, k_in).to(DEVICE) * 0.1
    weight: torch.Tensor | Q8_0Weight
    if q8:
        weight = _quantize(w)
        dense = weight.dequantize(dtype)  # the values the kernel multiplies by (rounded to dtype)
    else:
        weight = w.to(dtype)
        dense = weight
    a = torch.randn(tokens if gather_rows else tokens * K, k_in).to(DEVICE, dtype)
    for tiles in (TILES, GemmTiles(32, 64, 4, 1, 1), GemmTiles(16, 128, 4, 1, 1)):  # BK 64/128: a ragged K step
        align = moe_align(top_index, E, block_m=8)
        got = grouped_gemm(a, weight, align, K, tiles, gather_rows=gather_rows, top_weight=top_weight)
        ref = _reference(a, dense, top_index, gather_rows, top_weight)
        assert got.dtype == dtype and got.shape == (tokens * K, n_out)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.float(), ref, rtol=tol, atol=tol)


def _experts(q8: bool, intermediate: int, dtype: torch.dtype) -> Experts:
    torch.manual_seed(1)
    ex = Experts(E, H, intermediate)
    with torch.no_grad():
        assert ex.gate_up_proj is not None and ex.down_proj is not None
        ex.gate_up_proj.copy_(torch.randn(E, 2 * intermediate, H) * 0.1)
        ex.down_proj.copy_(torch.randn(E, H, intermediate) * 0.1)
    if q8:
        for name in ("gate_up_proj", "down_proj"):
            ex.set_quantized_param(name, _quantize(getattr(ex, name).detach()))
    return ex.to(DEVICE, dtype) if not q8 else _to(ex, dtype)


def _to(ex: Experts, dtype: torch.dtype) -> Experts:
    for name, packed in ex.quantized.items():
        assert isinstance(packed, Q8_0Weight)
        ex.quantized[name] = packed.to(DEVICE)
    return ex.to(DEVICE, dtype)


def _stacks(ex: Experts) -> tuple[torch.Tensor | Q8_0Weight, torch.Tensor | Q8_0Weight]:
    out = []
    for name in ("gate_up_proj", "down_proj"):
        w = ex.quantized.get(name) or getattr(ex, name)
        assert isinstance(w, torch.Tensor | Q8_0Weight)
        out.append(w.detach() if isinstance(w, torch.Tensor) else w)
    return out[0], out[1]


@pytest.mark.parametrize(("dtype", "q8", "tokens", "intermediate"), [
    (torch.float32, False, 40, 32), (torch.bfloat16, False, 33, 64),
    (torch.float32, True, 33, 64), (torch.bfloat16, True, 40, 32)], ids=["f32-dense", "bf16-dense", "f32-q8_0", "bf16-q8_0"])
def test_swiglu_experts_match_loop(dtype: torch.dtype, q8: bool, tokens: int, intermediate: int) -> None:
    ex = _experts(q8, intermediate, dtype)
    x = torch.randn(tokens, H).to(DEVICE, dtype)
    top_index = _routing(tokens, E, K, seed=tokens, skip=(2,))
    top_weight = torch.softmax(torch.randn(tokens, K), dim=-1).to(DEVICE, dtype)
    assert top_index.numel() > 64  # the loop path, not the decode gather
    with torch.no_grad():
        loop = ex(x, top_index, top_weight)  # CPU: the per-expert loop
        gate_up, down = _stacks(ex)
        got = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)
        again = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)
    assert got.dtype == dtype and got.shape == (tokens, H)
    assert torch.equal(got, again)  # deterministic: no atomics, fixed-order sum
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), loop.float(), rtol=tol, atol=tol)


def test_experts_forward_takes_the_grouped_path(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = _experts(True, 32, torch.float32)
    tokens = 40
    x = torch.randn(tokens, H).to(DEVICE)
    top_index = _routing(tokens, E, K, seed=7)
    top_weight = torch.softmax(torch.randn(tokens, K), dim=-1).to(DEVICE)
    calls: list[int] = []
    import stagewise.kernels.moe_experts as grouped

    real = grouped.grouped_swiglu_experts
    monkeypatch.setattr(grouped, "grouped_swiglu_experts", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        monkeypatch.setattr("stagewise.models.layers.experts.use_triton", lambda t: False)
        loop = ex(x, top_index, top_weight)
        monkeypatch.setattr("stagewise.models.layers.experts.use_triton", lambda t: True)
        got = ex(x, top_index, top_weight)
        decode = ex(x[:3], top_index[:3], top_weight[:3])  # <= 64 slots: still the gather path
    assert calls == [1] and decode.shape == (3, H)
    torch.testing.assert_close(got, loop, rtol=1e-5, atol=1e-5)


def test_config_block_sizes_agree() -> None:
    ex = _experts(False, 32, torch.float32)
    tokens = 12
    x = torch.randn(tokens, H).to(DEVICE)
    top_index = _routing(tokens, E, K, seed=11)
    top_weight = torch.rand(tokens, K).to(DEVICE)
    gate_up, down = _stacks(ex)
    with torch.no_grad():
        a = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, INTERPRETER)
        b = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,
                                   GroupedConfig(4, GemmTiles(64, 64, 4, 1, 1), GemmTiles(16, 32, 4, 1, 8)))
        empty = grouped_swiglu_experts(x[:0], top_index[:0], top_weight[:0], gate_up, down)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert empty.shape == (0, H)


@pytest.mark.parametrize(("tokens", "experts", "k", "block_m"), [(32, 128, 8, 16), (128, 128, 8, 16), (9, 60, 4, 16),
                                                                 (5, 8, 2, 4), (40, 8, 2, 16),
                                                                 (1, 8, 1, 16), (7, 4, 4, 1), (100, 16, 3, 8)])
def test_fused_align_equals_torch(tokens: int, experts: int, k: int, block_m: int) -> None:
    """The one-launch alignment gives the torch alignment's entries exactly (padding, order, blocks)."""
    from stagewise.kernels.moe_align_triton import moe_align_fused

    top_index = _routing(tokens, experts, k, seed=tokens + experts, skip=(1,) if experts > k + 1 else ())
    for index in (top_index, top_index.to(torch.int32)):
        want = moe_align(index, experts, block_m)
        got = moe_align_fused(index, experts, block_m)
        assert torch.equal(got.sorted_slots, want.sorted_slots)
        assert torch.equal(got.block_expert, want.block_expert)
        assert torch.equal(got.num_valid_blocks, want.num_valid_blocks)
        assert (got.num_slots, got.block_m) == (want.num_slots, want.block_m)


def _block_scaled_reference(a: torch.Tensor, weight: Q8_0Weight, top_index: torch.Tensor, gather_rows: bool,
                            top_weight: torch.Tensor | None) -> torch.Tensor:
    """float32: each 32-value block's dot with the int8 values, times its scale (the decode kernel's order)."""
    flat = top_index.reshape(-1)
    k = top_index.shape[1]
    rows = a.float()[flat.new_tensor(range(flat.numel())) // k] if gather_rows else a.float()
    qs = weight.qs.float()[flat]  # (S, N, K)
    scales = weight.scales.float()[flat]  # (S, N, K/32)
    parts = torch.einsum("snbj,sbj->snb", qs.unflatten(-1, (-1, 32)), rows.unflatten(-1, (-1, 32)))  # (S, N, K/32)
    out = (parts * scales).sum(-1)
    return out * top_weight.reshape(-1, 1).float() if top_weight is not None else out


DECODE_VARIANTS = [DecodeTiles(32, 64, 4, 1), DecodeTiles(16, 128, 4, 1), DecodeTiles(32, 32, 4, 1, swap=True),
                   DecodeTiles(16, 32, 4, 1, split_k=3), DecodeTiles(32, 32, 4, 1, split_k=2, swap=True),
                   DecodeTiles(32, 64, 4, 1, swap=True, tma=True),
                   DecodeTiles(16, 64, 4, 1, split_k=2, swap=True, tma=True),
                   DecodeTiles(32, 128, 4, 1, swap=True, tma=True, wide=True),
                   DecodeTiles(16, 64, 4, 1, split_k=2, swap=True, tma=True, wide=True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather_rows", [True, False], ids=["gather", "per_slot"])
def test_decode_gemm_matches_block_scaled_reference(gather_rows: bool, dtype: torch.dtype) -> None:
    """Every shape of the work (plain, swapped, split K, both) against the float32 block-scaled reference;
    split K's per-tile counters are zero again after each launch."""
    from stagewise.kernels.moe_decode_triton import decode_gemm, tile_counters

    torch.manual_seed(2)
    tokens, n_out, k_in = 9, 48, 128  # n_out not a multiple of BLOCK_N 32
    top_index = _routing(tokens, E, K, seed=5, skip=(3,))
    top_weight = torch.rand(tokens, K).to(DEVICE)
    weight = _quantize(torch.randn(E, n_out, k_in) * 0.1)
    weight = weight.to(DEVICE)
    a = torch.randn(tokens if gather_rows else tokens * K, k_in).to(DEVICE, dtype)
    align = moe_align(top_index, E, block_m=16)
    for i, tiles in enumerate(DECODE_VARIANTS):
        route = top_weight if i % 2 == 0 else None
        got = decode_gemm(a, weight, align, K, tiles, gather_rows=gather_rows, top_weight=route)
        ref = _block_scaled_reference(a, weight, top_index, gather_rows, route)
        assert got.shape == (tokens * K, n_out) and got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's rounding
        torch.testing.assert_close(got.float(), ref, rtol=tol, atol=tol, msg=functools.partial("{}: {}".format, tiles))
        assert torch.equal(decode_gemm(a, weight, align, K, tiles, gather_rows=gather_rows, top_weight=route), got)
        assert not tile_counters(a.device, 1).any()
    strided = Q8_0Weight(weight.qs.transpose(1, 2).contiguous().transpose(1, 2), weight.scales)  # not contiguous
    got = decode_gemm(a, strided, align, K, DECODE_VARIANTS[-1], gather_rows=gather_rows)  # TMA asked: plain loads
    torch.testing.assert_close(got.float(), _block_scaled_reference(a, weight, top_index, gather_rows, None),
                               rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="K step"):
        decode_gemm(a, weight, align, K, DecodeTiles(32, 96, 4, 1), gather_rows=gather_rows)


@pytest.mark.parametrize("tiles", DECODE_VARIANTS[2:],
                         ids=["swap", "split", "swap_split", "tma", "tma_split", "wide", "wide_split"])
def test_decode_gemm_glu_equals_gemm_then_silu_mul(tiles: DecodeTiles) -> None:
    """The fused gate/up GEMM with SiLU·up equals the plain decode GEMM followed by ``silu_mul`` (torch.equal)."""
    from stagewise.kernels.moe_decode_triton import decode_gemm, decode_gemm_glu

    torch.manual_seed(3)
    tokens, inter, k_in = 7, 64, 128  # whole tiles: the up rows sit where the gate rows do in their tiles
    top_index = _routing(tokens, E, K, seed=8)
    weight = _quantize(torch.randn(E, 2 * inter, k_in) * 0.1).to(DEVICE)
    a = torch.randn(tokens, k_in).to(DEVICE)
    align = moe_align(top_index, E, block_m=16)
    fused = decode_gemm_glu(a, weight, align, K, tiles, gather_rows=True)
    plain = silu_mul(decode_gemm(a, weight, align, K, tiles, gather_rows=True))
    assert fused.shape == (tokens * K, inter)
    assert torch.equal(fused, plain)


def test_decode_config_matches_loop() -> None:
    """The batched-decode experts (decode GEMMs + combine, residual added) agree with the per-expert loop."""
    from stagewise.kernels.moe_decode_triton import DECODE_Q8_0, DecodeConfig

    ex = _experts(True, 64, torch.float32)
    tokens = 12
    x = torch.randn(tokens, H).to(DEVICE)
    residual = torch.randn(tokens, H).to(DEVICE)
    top_index = _routing(tokens, E, K, seed=13)
    top_weight = torch.softmax(torch.randn(tokens, K), dim=-1).to(DEVICE)
    assert DECODE_Q8_0.block_m == 16
    with torch.no_grad():
        gate_up, down = _stacks(ex)
        plain = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, INTERPRETER, residual=residual)
        for tiles in (DecodeTiles(32, 32, 4, 1), DecodeTiles(32, 32, 4, 1, split_k=2, swap=True)):
            small = DecodeConfig(16, tiles, dataclasses.replace(tiles, block_k=64))
            got = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, small, residual=residual)
            assert got.shape == (tokens, H)
            torch.testing.assert_close(got, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("rows", "in_features"), [(5, 256), (8, 2048), (17, 256), (32, 256), (64, 256), (33, 2048)])
def test_q8_0_gemm_batched_decode_rows(rows: int, in_features: int) -> None:
    """1-64 rows (a batched decode step's dense Q8_0 matmuls; fewer than 16 fill part of a 16-row block) agree
    with the block-scaled reference; with 2,048 inputs K is split (a 96-output matrix has 2 tiles)."""
    from stagewise.kernels.q8_0_gemm import decode_tiles, q8_0_gemm

    torch.manual_seed(4)
    assert decode_tiles(33, 96, 2048)[1].split_k > 1 and decode_tiles(33, 96, 2048)[0] == 64
    weight = _quantize(torch.randn(1, 96, in_features) * 0.1).to(DEVICE)
    x = torch.randn(rows, in_features, device=DEVICE, dtype=torch.bfloat16)
    got = q8_0_gemm(x, weight.qs[0], weight.scales[0])
    ref = _block_scaled_reference(x, weight, torch.zeros(rows, 1, dtype=torch.long, device=DEVICE), True, None)
    torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("rows", "in_features"), [(2, 256), (8, 2048), (17, 256), (40, 2048)])
def test_q8_0_gate_up_with_silu_mul_in_one_launch(rows: int, in_features: int) -> None:
    """A fused gate/up Q8_0 weight at 2-64 rows: SiLU·up in the few-rows GEMM's epilogue, with its K split over the
    whole weight, gives bit for bit the matmul followed by ``silu_mul``; one row (the GEMV) and prefill sizes have
    no such launch."""
    from stagewise.kernels.q8_0_gemm import decode_tiles
    from stagewise.kernels.triton_launch import kernels_on_host

    torch.manual_seed(5)
    inter = 96
    stack = _quantize(torch.randn(1, 2 * inter, in_features) * 0.1).to(DEVICE)
    weight = Q8_0Weight(stack.qs[0], stack.scales[0])
    x = torch.randn(rows, in_features, device=DEVICE, dtype=torch.bfloat16)
    with kernels_on_host():
        fused = weight.matmul_glu(x)
        assert fused is not None and fused.shape == (rows, inter)
        assert torch.equal(fused, silu_mul(weight.matmul(x)))
        assert weight.matmul_glu(x[:1]) is None
        assert weight.matmul_glu(torch.randn(65, in_features, device=DEVICE, dtype=torch.bfloat16)) is None
    assert in_features < 2048 or decode_tiles(rows, 2 * inter, in_features)[1].split_k > 1  # K split too
