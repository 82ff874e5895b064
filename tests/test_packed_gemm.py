"""The SwiGLU experts over packed expert stacks against the per-slot loop on the dequantized weights:
kernel B's expert blocks (prefill sizes), kernel A's (decode sizes) and the grouped GEMM (a packed stack
beside a dense one), every packed type, and
a ``Q4_K_M`` mix (gate/up and down of different types). On a GPU the kernels run compiled, without one
in Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import pytest
import torch
from gguf.constants import GGMLQuantizationType

pytest.importorskip("triton")
if not torch.cuda.is_available():
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

import stagewise.kernels.moe_experts as moe_experts
from stagewise.kernels.moe_experts import grouped_swiglu_experts
from stagewise.weights.quant.packed_weight import PackedWeight
from tests.test_packed_kernels import DEVICE, _on_device, _random_rows

T = GGMLQuantizationType


def _stack(qtype: GGMLQuantizationType, experts: int, rows: int, k: int, seed: int) -> PackedWeight:
    raw = _random_rows(qtype, experts * rows, k, seed=seed).reshape(experts, rows, -1)
    return PackedWeight.from_rows(_on_device(raw), qtype, k)


def _loop(x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor, gate_up: PackedWeight,
          down: PackedWeight) -> torch.Tensor:
    wg = gate_up.dequantize(torch.float32).cpu()  # (E, 2I, H)
    wd = down.dequantize(torch.float32).cpu()  # (E, H, I)
    ref = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(top_index.shape[1]):
            e = int(top_index[t, j])
            gate, up = (wg[e] @ x[t]).chunk(2)
            ref[t] += top_weight[t, j] * (wd[e] @ (torch.nn.functional.silu(gate) * up))
    return ref


@pytest.mark.parametrize(("gate_type", "down_type", "tokens"),
                         [(T.Q4_K, T.Q4_K, 24), (T.Q6_K, T.Q6_K, 24), (T.IQ4_XS, T.IQ4_XS, 24), (T.Q4_0, T.Q4_0, 24),
                          (T.Q4_K, T.Q6_K, 3), (T.Q5_1, T.MXFP4, 2), (T.Q2_K, T.Q3_K, 3), (T.IQ4_NL, T.Q5_K, 2)],
                         ids=lambda v: v.name if isinstance(v, GGMLQuantizationType) else str(v))
def test_experts_over_packed_stacks_match_the_loop(gate_type: GGMLQuantizationType, down_type: GGMLQuantizationType,
                                                   tokens: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """24 tokens x 2 of 4 experts: kernel B's blocks; 2-3 tokens (at most 4 slots an expert): kernel A's; and the
    grouped GEMM's dequantized tiles on the same stacks (what a packed stack beside a dense one takes)."""
    experts, hidden, inter, top_k = 4, 256, 256, 2
    gate_up = _stack(gate_type, experts, 2 * inter, hidden, seed=3)
    down = _stack(down_type, experts, hidden, inter, seed=4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hidden, generator=g) * 0.1
    top_index = torch.topk(torch.rand(tokens, experts, generator=g), top_k, dim=-1).indices
    top_weight = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    calls: list[str] = []
    real = moe_experts.packed_decode_gemm_glu
    monkeypatch.setattr(moe_experts, "packed_decode_gemm_glu",
                        lambda *a, **kw: calls.append("A" if a[4].scale_after else "B") or real(*a, **kw))
    args = (x.to(DEVICE), top_index.to(DEVICE), top_weight.to(DEVICE), gate_up, down)
    got = grouped_swiglu_experts(*args).cpu()
    assert calls == (["A"] if tokens * top_k <= moe_experts.DECODE_SLOTS_PER_EXPERT * experts else ["B"])
    ref = _loop(x, top_index, top_weight, gate_up, down)
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    grouped = grouped_swiglu_experts(*args, moe_experts.packed_config(x.device, gate_up, down, tokens * top_k,
                                                                      experts)).cpu()
    assert float((grouped - ref).abs().max()) <= 1e-4 * float(ref.abs().max())


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_gathered_experts_read_blocks_from_two_tokens(qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gather_matmul`` (MoE decode's gathered path): one token's 3 slots through the GEMV, 3 tokens' 9 slots
    through kernel A's one-expert blocks; both per slot as the dequantized stack gives."""
    import stagewise.kernels.packed_decode_triton as packed_decode
    from stagewise.kernels.triton_launch import kernels_on_host

    calls: list[int] = []
    real = packed_decode.packed_decode_gemm
    monkeypatch.setattr(packed_decode, "packed_decode_gemm", lambda *a, **kw: calls.append(a[2].num_slots) or real(*a, **kw))
    experts, n, k, top_k = 4, 24, 256, 3
    w = _stack(qtype, experts, n, k, seed=6)
    dense = w.dequantize(torch.float32).cpu()
    g = torch.Generator().manual_seed(7)
    for tokens in (1, 3):
        x = torch.randn(tokens, k, generator=g)
        index = torch.topk(torch.rand(tokens, experts, generator=g), top_k, dim=-1).indices.reshape(-1)
        with kernels_on_host():
            got = w.gather_matmul(index.to(DEVICE), x.to(DEVICE), x_repeat=top_k).cpu()
        ref = torch.stack([dense[int(index[m])] @ x[m // top_k] for m in range(tokens * top_k)])
        assert float((got - ref).abs().max()) <= 2e-5 * float(ref.abs().max())
    assert calls == [9]  # the blocks for 9 slots only: 3 slots took the GEMV


@pytest.mark.parametrize(("gate_type", "down_type"), [(T.Q4_K, T.Q4_K), (T.Q4_K, T.Q6_K)], ids=lambda t: t.name)
def test_a_layers_stacks_share_one_sorting_of_the_slots(gate_type: GGMLQuantizationType, down_type: GGMLQuantizationType,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """MoE decode's gathered path over packed stacks (4 tokens x 3 slots: one-expert blocks): the slots are sorted
    once for the layer (gate/up and down read the same blocks), with the outputs each stack sorting them itself gives."""
    import stagewise.weights.quant.packed_weight as packed_weight
    from stagewise.kernels.triton_launch import kernels_on_host
    from stagewise.models.layers.experts import Experts

    experts, hidden, inter, tokens, top_k = 4, 256, 256, 4, 3
    layer = Experts(experts, hidden, inter)
    layer.set_quantized_param("gate_up_proj", _stack(gate_type, experts, 2 * inter, hidden, seed=8))
    layer.set_quantized_param("down_proj", _stack(down_type, experts, hidden, inter, seed=9))
    g = torch.Generator().manual_seed(10)
    x = (torch.randn(tokens, hidden, generator=g) * 0.1).to(DEVICE)
    top_index = torch.topk(torch.rand(tokens, experts, generator=g), top_k, dim=-1).indices.to(DEVICE)
    top_weight = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1).to(DEVICE)
    sorts: list[int] = []
    real = packed_weight.PackedWeight.routing
    monkeypatch.setattr(packed_weight.PackedWeight, "routing", lambda self, index: sorts.append(index.numel()) or real(self, index))
    with kernels_on_host():
        shared = layer(x, top_index, top_weight).cpu()
        assert sorts == [tokens * top_k]
        monkeypatch.setattr(layer, "_routing", lambda index: None)  # each stack sorts the slots itself
        alone = layer(x, top_index, top_weight).cpu()
    assert sorts == [tokens * top_k] * 3 and torch.equal(shared, alone)
