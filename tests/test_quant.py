"""Quantized formats: torch dequantization against gguf.quants, and the resident Q8_0 weight."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stagewise.errors import UnsupportedTensorType
from stagewise.weights.quant.dequant import dequantize
from stagewise.weights.quant.q8_0 import Q8_0Weight
from stagewise.weights.quant.tensor_decode import check_supported, decode_dense

T = GGMLQuantizationType
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS,
         T.MXFP4]
# byte offsets of the f16 scales in each block (kept finite so NaN != NaN does not get in the way)
_F16_AT = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108],
           T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}
# byte offsets of E8M0 exponents: 0..252 keeps every value finite (2**124 * 12 < float32 max), and
# takes in the subnormal halves of 0 and 1
_E8M0_AT = {T.MXFP4: [0]}


def _random_blocks(qtype: GGMLQuantizationType, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    _, type_bytes = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, type_bytes), dtype=np.uint8)
    scales = rng.normal(0, 0.05, size=(rows, blocks_per_row, len(_F16_AT[qtype]))).astype(np.float16)
    for k, at in enumerate(_F16_AT[qtype]):
        raw[..., at : at + 2] = scales[..., k : k + 1].view(np.uint8)
    for at in _E8M0_AT.get(qtype, []):
        raw[..., at] = rng.integers(0, 253, size=(rows, blocks_per_row), dtype=np.uint8)
        raw[0, :3, at] = [0, 1, 2]  # the two subnormal halves and the first normal one
    return raw.reshape(rows, blocks_per_row * type_bytes)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_exactly(qtype: GGMLQuantizationType) -> None:
    block, _ = GGML_QUANT_SIZES[qtype]
    raw = _random_blocks(qtype, rows=5, blocks_per_row=3, seed=int(qtype))
    ref = gguf.quants.dequantize(raw, qtype)  # (5, 3 * block)
    got = dequantize(torch.from_numpy(raw.copy()), qtype, (5, 3 * block), chunk_blocks=4)
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), ref)
    dense = decode_dense(torch.from_numpy(raw.copy()).reshape(-1), qtype, (5, 3 * block), torch.device("cpu"))
    assert np.array_equal(dense.numpy(), ref)


def test_every_packed_type_has_a_torch_dequantizer() -> None:
    from stagewise.spec.packed_types import PACKED
    from stagewise.weights.quant.dequant import DEQUANTIZERS

    assert set(DEQUANTIZERS) == PACKED and set(TYPES) == PACKED


def test_other_types_are_refused_by_name() -> None:
    with pytest.raises(UnsupportedTensorType, match=r"m.gguf: tensor 'blk\.0\.x' has type NVFP4"):
        check_supported(GGMLQuantizationType.NVFP4, "m.gguf", "blk.0.x")
    for qtype in (T.F32, T.BF16, T.Q2_K, T.MXFP4, T.IQ2_XS, T.IQ1_M, T.TQ2_0):
        check_supported(qtype, "m.gguf", "blk.0.x")


@pytest.mark.parametrize("qtype", [T.IQ2_XS, T.IQ3_S], ids=lambda t: t.name)
def test_expanded_types_decode_exactly_in_slabs(qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch) -> None:
    from stagewise.weights.quant import dequant, tensor_decode

    rng = np.random.default_rng(int(qtype))
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    rows, blocks_per_row = 9, 2
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, type_bytes), dtype=np.uint8)  # any grid index is valid
    raw[..., 0:2] = rng.normal(0, 0.05, size=(rows, blocks_per_row, 1)).astype(np.float16).view(np.uint8)  # d
    raw = raw.reshape(rows, -1)
    ref = gguf.quants.dequantize(raw, qtype)  # (9, 2 * block)
    monkeypatch.setattr(tensor_decode, "DECODE_CHUNK_ELEMENTS", 4 * blocks_per_row * block)  # 4 rows per slab
    monkeypatch.setattr(dequant, "EXPANDED_CHUNK_BLOCKS", 3)  # gguf.quants on 3 blocks at a time
    flat = torch.from_numpy(raw.copy()).reshape(-1)
    got = tensor_decode.decode_to(flat, qtype, (rows, blocks_per_row * block), torch.device("cpu"), torch.float32)
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), ref)
    dense = decode_dense(flat, qtype, (rows, blocks_per_row * block), torch.device("cpu"))
    assert np.array_equal(dense.numpy(), ref)
    assert torch.equal(tensor_decode.decode_to(flat, qtype, tuple(ref.shape), torch.device("cpu"), torch.bfloat16),
                       torch.from_numpy(ref).to(torch.bfloat16))


def _q8(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.quantize(values.astype(np.float32), GGMLQuantizationType.Q8_0).copy())


def test_q8_0_weight_layout_and_matmul() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.02, size=(48, 96)).astype(np.float32)
    raw = _q8(w)
    weight = Q8_0Weight.from_blocks(raw.reshape(-1), (48, 96), torch.device("cpu"))
    ref = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), GGMLQuantizationType.Q8_0))
    assert weight.shape == (48, 96) and weight.nbytes == 48 * 96 // 32 * 34  # 34 bytes per 32 elements
    assert torch.equal(weight.dequantize(torch.float32), ref)
    x = torch.randn(3, 7, 96)
    assert torch.allclose(weight.matmul(x), x @ ref.T, rtol=0, atol=1e-6)
    assert weight.matmul(x.bfloat16()).dtype == torch.bfloat16


def test_q8_0_tiled_matmul_equals_untiled(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _q8(np.random.default_rng(1).normal(0, 1, size=(100, 64)))
    weight = Q8_0Weight.from_blocks(raw.reshape(-1), (100, 64), torch.device("cpu"))
    x = torch.randn(5, 64)
    whole = weight.matmul(x)
    monkeypatch.setattr("stagewise.weights.quant.q8_0.TILE_ELEMENTS", 64 * 7)  # 7 rows per tile
    tiled = weight.matmul(x)
    assert torch.allclose(tiled, whole, rtol=0, atol=1e-5)
    assert torch.allclose(tiled, x @ weight.dequantize(torch.float32).T, rtol=0, atol=1e-5)


def test_q8_0_experts_are_views() -> None:
    raw = _q8(np.random.default_rng(2).normal(0, 1, size=(4 * 6, 32)))
    stacked = Q8_0Weight.from_blocks(raw.reshape(-1), (4, 6, 32), torch.device("cpu"))
    one = stacked.expert(2)
    assert one.shape == (6, 32) and one.qs.data_ptr() == stacked.qs[2].data_ptr()  # no copy
    assert torch.equal(one.dequantize(torch.float32), stacked.dequantize(torch.float32)[2])
    with pytest.raises(ValueError):
        stacked.matmul(torch.randn(1, 32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 5, 16, 17, 300])
def test_q8_0_cuda_kernel_matches_dequantized(dtype: torch.dtype, tokens: int) -> None:
    raw = _q8(np.random.default_rng(3).normal(0, 0.02, size=(1000, 4096)))
    weight = Q8_0Weight.from_blocks(raw.reshape(-1), (1000, 4096), torch.device("cuda"))
    x = torch.randn(tokens, 4096, device="cuda", dtype=dtype)
    ref = x.float() @ weight.dequantize(torch.float32).T
    got = weight.matmul(x)
    assert got.dtype == dtype and got.shape == (tokens, 1000)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert float((got.float() - ref).norm() / ref.norm()) <= tol
    assert torch.equal(weight.matmul(x), got)  # same inputs, same kernel, same result


def test_torch_q8_0_quantizer_matches_gguf_bytes() -> None:
    import gguf
    import numpy as np

    from stagewise.weights.quant.quantize import quantize_q8_0

    gen = torch.Generator().manual_seed(3)
    values = torch.randn(64, 256, generator=gen) * torch.logspace(-4, 1, 64)[:, None]
    values[3] = 0.0  # an all-zero block keeps a zero scale
    values[5, :32] = 0.5  # exact halves round away from zero
    ours = quantize_q8_0(values).numpy()
    ref = gguf.quants.quantize(values.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
    assert np.array_equal(ours, ref)


def test_decode_to_in_slabs_equals_whole_dequantization(monkeypatch: pytest.MonkeyPatch) -> None:
    from stagewise.weights.quant import tensor_decode

    gen = np.random.default_rng(5)
    values = gen.standard_normal((40, 64)).astype(np.float32)
    raw = torch.from_numpy(gguf.quants.quantize(values, GGMLQuantizationType.Q8_0).reshape(-1).copy())
    whole = dequantize(raw, GGMLQuantizationType.Q8_0, (40, 64))
    monkeypatch.setattr(tensor_decode, "DECODE_CHUNK_ELEMENTS", 64 * 7)  # 7 rows per slab: 6 slabs
    slabs = tensor_decode.decode_to(raw, GGMLQuantizationType.Q8_0, (40, 64), torch.device("cpu"), torch.bfloat16)
    assert slabs.dtype == torch.bfloat16 and torch.equal(slabs, whole.to(torch.bfloat16))
