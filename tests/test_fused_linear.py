"""fuse_linears: one matmul equals the separate projections; packed Q8_0 parts stay packed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stagewise.models.layers.fused_linear import fuse_linears
from stagewise.models.layers.linear import Linear
from stagewise.weights.gguf_export import quantize_q8_0
from stagewise.weights.quant.q8_0 import Q8_0Weight


def _dense(out_features: int, seed: int, bias: bool = False) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = Linear(64, out_features, bias)
    lin.weight = nn.Parameter(torch.randn(out_features, 64, generator=gen), requires_grad=False)
    if bias:
        lin.bias = nn.Parameter(torch.randn(out_features, generator=gen), requires_grad=False)
    return lin


def _packed(out_features: int, seed: int) -> Linear:
    lin = _dense(out_features, seed)
    assert lin.weight is not None
    blocks = quantize_q8_0(lin.weight.detach())
    lin.set_quantized(Q8_0Weight.from_blocks(blocks.reshape(-1), (out_features, 64), torch.device("cpu")))
    return lin


def test_dense_fusion_matches_separate_projections() -> None:
    parts = [_dense(48, 1, bias=True), _dense(16, 2, bias=True), _dense(16, 3, bias=True)]
    x = torch.randn(3, 5, 64)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse_linears(parts)
    assert fused is not None and fused.out_features == 80
    torch.testing.assert_close(fused(x), separate, rtol=1e-6, atol=1e-6)
    assert all(p.weight is None and p.bias is None for p in parts)  # one copy stays resident


def test_packed_fusion_stays_packed() -> None:
    parts = [_packed(64, 4), _packed(32, 5)]
    x = torch.randn(7, 64)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    nbytes = sum(p.quantized.nbytes for p in parts if p.quantized is not None)
    fused = fuse_linears(parts)
    assert fused is not None and fused.weight is None and fused.quantized is not None
    assert fused.quantized.nbytes == nbytes
    torch.testing.assert_close(fused(x), separate, rtol=1e-5, atol=1e-5)


def test_mixed_parts_are_left_alone() -> None:
    parts = [_dense(32, 6), _packed(32, 7)]
    assert fuse_linears(parts) is None
    assert parts[0].weight is not None and parts[1].quantized is not None


def test_an_aligned_output_is_a_row_strided_view_of_the_same_product() -> None:
    """A router with its shared expert's gate row (257 outputs) asks for rows that start 16 bytes apart,
    which the matmul library's aligned kernels need; the values are the plain projection's."""
    torch.manual_seed(0)
    for out_features, dtype in ((257, torch.bfloat16), (256, torch.bfloat16), (5, torch.float32)):
        lin = _dense(out_features, 4)
        assert lin.weight is not None
        lin.weight = nn.Parameter(lin.weight.to(dtype), requires_grad=False)
        x = torch.randn(2, 9, 64, dtype=dtype)
        y = lin(x, aligned=True)
        assert y.shape == (2, 9, out_features)
        assert (y.stride(-2) * y.element_size()) % 16 == 0 and y.stride(-1) == 1
        assert torch.equal(y, nn.functional.linear(x, lin.weight))


def test_q_and_k_fuse_where_v_is_stored_in_another_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_K_M mix stores some layers' ``attn_v`` in a type of more bits than ``attn_q`` / ``attn_k``
    (tiny-llama's layer 2: Q8_0 beside Q5_0): those layers run q and k as one matmul and v apart, and decode
    as the three separate projections do."""
    from stagewise.engine.generation_request import GenerationRequest
    from stagewise.engine.generator import Generator
    from stagewise.engine.model_loading import load_model
    from stagewise.engine.sampling import SamplingParams
    from stagewise.models.layers.attention import Attention

    def run() -> tuple[list[list[list[int]]], list[tuple[int, float]]]:
        loaded = load_model("random:tiny-llama@q4_k_m", devices="cpu:1x1GiB", placement="single", context=64,
                            dtype="float32")
        try:
            attns = [m for m in loaded.pipeline.stages[0].model.modules() if isinstance(m, Attention)]
            fused = [a.qkv_fused.groups for a in attns]  # which of q (0), k (1), v (2) run as one matmul
            generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=8)
            request = GenerationRequest(tuple(range(1, 12)), 8, SamplingParams(temperature=0.0), top_logprobs=1)
            return fused, [(e.sample.token, e.sample.logprob) for e in generator.stream(request)]
        finally:
            loaded.close()

    fused, tokens = run()
    assert fused == [[[0, 1, 2]], [[0, 1, 2]], [[0, 1]]]
    monkeypatch.setattr(Attention, "fuse", lambda self: self.qkv_fused.fuse_parts(  # q, k and v fused only when all agree
        self._projections(), [[0, 1, 2]]))
    separate, reference = run()
    assert separate == [[[0, 1, 2]], [[0, 1, 2]], []]
    assert [t for t, _ in tokens] == [t for t, _ in reference]
    assert [lp for _, lp in tokens] == pytest.approx([lp for _, lp in reference], abs=1e-5)
