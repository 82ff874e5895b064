"""The packed GEMM (many rows: prefill, batched decode) and the grouped MoE GEMM over packed expert
stacks, against float32 references on the dequantized weights. On a GPU the kernels run compiled,
without one in Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import pytest
import torch
from gguf.constants import GGMLQuantizationType

pytest.importorskip("triton")
if not torch.cuda.is_available():
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.kernels.moe_experts import grouped_swiglu_experts
from stagewise.kernels.packed_gemm import packed_gemm
from stagewise.weights.quant.packed_weight import PackedWeight
from tests.test_packed_kernels import DEVICE, _dense, _on_device, _random_rows

T = GGMLQuantizationType
TYPES = [T.Q4_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
TOL = 1e-5  # of max |y| at float32 (summation order only)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_packed_gemm_matches_dense_matmul(qtype: GGMLQuantizationType) -> None:
    n, k, rows = 48, 512, 20
    raw = _random_rows(qtype, n, k, seed=int(qtype))
    w = _dense(raw, qtype)  # (n, k) float32 reference
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1))
    y = packed_gemm(x.to(DEVICE), PackedWeight.from_rows(_on_device(raw), qtype, k)).cpu()
    ref = x @ w.T
    assert y.shape == (rows, n)
    assert float((y - ref).abs().max()) <= TOL * float(ref.abs().max())


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.IQ4_XS, T.Q4_0], ids=lambda t: t.name)
def test_grouped_experts_over_packed_stacks_match_the_loop(qtype: GGMLQuantizationType) -> None:
    experts, hidden, inter, tokens, top_k = 4, 256, 256, 24, 2
    gate_up_raw = _random_rows(qtype, experts * 2 * inter, hidden, seed=3).reshape(experts, 2 * inter, -1)
    down_raw = _random_rows(qtype, experts * hidden, inter, seed=4).reshape(experts, hidden, -1)
    gate_up = PackedWeight.from_rows(_on_device(gate_up_raw), qtype, hidden)
    down = PackedWeight.from_rows(_on_device(down_raw), qtype, inter)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hidden, generator=g) * 0.1
    top_index = torch.topk(torch.rand(tokens, experts, generator=g), top_k, dim=-1).indices
    top_weight = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    got = grouped_swiglu_experts(x.to(DEVICE), top_index.to(DEVICE), top_weight.to(DEVICE), gate_up, down).cpu()
    wg = gate_up.dequantize(torch.float32).cpu()  # (E, 2I, H)
    wd = down.dequantize(torch.float32).cpu()  # (E, H, I)
    ref = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(top_k):
            e = int(top_index[t, j])
            gate, up = (wg[e] @ x[t]).chunk(2)
            ref[t] += top_weight[t, j] * (wd[e] @ (torch.nn.functional.silu(gate) * up))
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
