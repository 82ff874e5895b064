"""The packed-block Triton kernels (every GGUF block type) against gguf.quants, run by Triton's interpreter on CPU.

``dequantize_rows`` must equal ``gguf.quants.dequantize`` bit for bit (FMA contraction off); the packed
GEMV must equal a float32 ``x @ W.T`` of the dequantized weight up to summation order (and, on a GPU,
FMA contraction): ``GEMV_TOL`` of the output's largest magnitude, measured at ~3e-7 here.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from stagewise.kernels.expert_stacks import PackedTensors
from stagewise.kernels.packed_dequant_triton import dequantize_rows
from stagewise.kernels.packed_gemv_triton import config_for, packed_gemv
from stagewise.weights.quant.packed_planes import split_planes

T = GGMLQuantizationType
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# byte offsets of each block's f16 scales (kept finite: NaN != NaN would hide a mismatch)
F16_AT = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108],
          T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}
TYPES = list(F16_AT)
GEMV_TOL = 2e-6  # of max |y|, float32 input (summation order only)
HALF_TOL = 1e-2  # of max |y|, bf16 / f16 input and output (one rounding of the output)


def _random_rows(qtype: GGMLQuantizationType, rows: int, k: int, seed: int) -> np.ndarray:
    """``rows`` rows of ``k`` values as random block bytes with finite scales: uint8 ``(rows, row_bytes)``."""
    rng = np.random.default_rng(seed)
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    blocks = k // block
    raw = rng.integers(0, 256, size=(rows, blocks, type_bytes), dtype=np.uint8)
    scales = rng.normal(0, 0.05, size=(rows, blocks, max(1, len(F16_AT[qtype])))).astype(np.float16)
    for i, at in enumerate(F16_AT[qtype]):
        raw[..., at : at + 2] = scales[..., i : i + 1].view(np.uint8)
    if qtype == T.MXFP4:  # E8M0 exponent byte: moderate, plus the two subnormal codes 0 and 1
        raw[..., 0] = rng.integers(118, 136, size=(rows, blocks))
        raw[0, :2, 0] = [0, 1]
    return raw.reshape(rows, blocks * type_bytes)


def _dense(raw: np.ndarray, qtype: GGMLQuantizationType) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, qtype))


def _on_device(raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(raw.copy()).to(DEVICE)


def _planes(raw: np.ndarray, qtype: GGMLQuantizationType) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The resident planes of file rows ``raw`` on the test device."""
    return split_planes(_on_device(raw), qtype)


def _stack(raw: np.ndarray, qtype: GGMLQuantizationType) -> PackedTensors:
    return PackedTensors(*_planes(raw, qtype), qtype, raw.shape[-1] // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_rows_matches_gguf_exactly(qtype: GGMLQuantizationType) -> None:
    raw = _random_rows(qtype, rows=19, k=768, seed=int(qtype))  # 19 rows: a partial row tile; 768: a partial K tile
    ref = _dense(raw, qtype)
    got = dequantize_rows(*_planes(raw, qtype), qtype, 768).cpu()
    assert got.dtype == torch.float32 and (ref != 0).float().mean() > 0.5
    assert torch.equal(got, ref)
    assert torch.equal(dequantize_rows(*_planes(raw, qtype), qtype, 768, torch.float16).cpu(), ref.to(torch.float16))
    ids = torch.tensor([7, 0, 7, 18]).to(DEVICE)  # an embedding gather: index_select, then the kernel
    gathered = dequantize_rows(*(p.index_select(0, ids) for p in _planes(raw, qtype)), qtype, 768).cpu()
    assert torch.equal(gathered, ref[ids.cpu()])


def test_dequantize_rows_refuses_bad_rows() -> None:
    planes = _planes(_random_rows(T.Q4_K, rows=2, k=256, seed=0), T.Q4_K)
    with pytest.raises(ValueError, match="bytes per row do not hold 512 values"):
        dequantize_rows(*planes, T.Q4_K, 512)
    with pytest.raises(ValueError, match="not a packed block type"):
        dequantize_rows(*planes, T.F16, 256)


def _close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    scale = ref.abs().max().item()
    assert scale > 0
    err = (got.float() - ref).abs().max().item()
    assert err <= tol * scale, f"max error {err:.3g} > {tol:g} x {scale:.3g}"


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("config", [None, (4, 256, 4, 1)], ids=["default", "steps"])
def test_packed_gemv_matches_dense_matmul(qtype: GGMLQuantizationType, config: tuple[int, int, int, int] | None) -> None:
    torch.manual_seed(int(qtype))
    n, k = 13, 768  # 13 rows: a partial row tile; 768 with 256-wide steps: three steps, or one partial 1024 step
    raw = _random_rows(qtype, rows=n, k=k, seed=int(qtype) + 1)
    w = _dense(raw, qtype)
    x = torch.randn(3, k)
    _close(packed_gemv(x.to(DEVICE), _stack(raw, qtype), config=config).cpu(), x @ w.T, GEMV_TOL)
    y_half = packed_gemv(x[:1].to(DEVICE, torch.float16), _stack(raw, qtype), config=config)
    assert y_half.dtype == torch.float16 and y_half.shape == (1, n)
    _close(y_half.cpu(), x[:1].half().float() @ w.T, HALF_TOL)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("x_repeat", [1, 2])
def test_packed_gemv_gathers_the_routed_experts(qtype: GGMLQuantizationType, x_repeat: int) -> None:
    torch.manual_seed(x_repeat)
    experts, n, k = 4, 8, 512
    raw = np.stack([_random_rows(qtype, rows=n, k=k, seed=100 * int(qtype) + e) for e in range(experts)])
    w = torch.stack([_dense(r, qtype) for r in raw])  # (E, N, K)
    index = torch.tensor([3, 0, 3, 1])  # (M,): expert 3 twice, 2 never read
    x = torch.randn(4 // x_repeat, k)
    got = packed_gemv(x.to(DEVICE), _stack(raw, qtype), index.to(DEVICE), x_repeat=x_repeat).cpu()
    ref = torch.stack([w[index[m]] @ x[m // x_repeat] for m in range(4)])
    _close(got, ref, GEMV_TOL)


def test_packed_gemv_refuses_a_stack_without_indices() -> None:
    raw = np.stack([_random_rows(T.Q4_0, rows=4, k=64, seed=e) for e in range(2)])
    with pytest.raises(ValueError, match="one expert index per output row"):
        packed_gemv(torch.randn(2, 64, device=DEVICE), _stack(raw, T.Q4_0))


def test_configs_are_a_function_of_type_and_shape() -> None:
    assert config_for(T.Q4_K, 4096, 4096, False) == config_for(T.Q4_K, 4096, 4096, False)
    for qtype in TYPES:
        block = GGML_QUANT_SIZES[qtype][0]
        for n, k, gather in [(8, block, False), (14336, 4096, False), (128256, 4096, False), (768, 2048, True)]:
            _, block_k, _, _ = config_for(qtype, n, k, gather)
            assert block_k % block == 0 and block_k & (block_k - 1) == 0


def _within_a_bf16_ulp(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Each output within one bf16 ulp (at most 2^-7 of the value: the interpreter's bf16 conversion truncates) of
    the float32 reference, plus 1e-5 of the largest output (the float32 sum's own rounding)."""
    err = (got.float() - ref).abs()
    bound = ref.abs() * 2.0**-7 + 1e-5 * ref.abs().max()
    assert bool((err <= bound).all()), float((err / bound).max())


@pytest.mark.parametrize("qtype", [T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS], ids=lambda t: t.name)
@pytest.mark.parametrize("n, k", [(13, 2048), (8, 4096), (5, 6144), (37, 512), (9, 256)],
                         ids=["k2048", "k4096", "k6144-steps", "k512-row-sets", "k256-row-sets"])
def test_the_word_gemv_matches_dense_matmul(qtype: GGMLQuantizationType, n: int, k: int) -> None:
    """One Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS matrix with bf16 input takes the word GEMV (magic-number values, inline
    PTX on a GPU, Triton's ops here): each output within one bf16 ulp of float32 ``x @ W.T``, for a partial row
    tile, K of one and of three steps, and short K (several sets of rows a warp, the last set partial)."""
    from stagewise.kernels.word_gemv_triton import words_config

    assert words_config(qtype, k, False, torch.bfloat16) is not None
    raw = _random_rows(qtype, rows=n, k=k, seed=k + n)
    w = _dense(raw, qtype)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(n)).bfloat16()
    got = packed_gemv(x.to(DEVICE), _stack(raw, qtype)).cpu()
    ref = x.float() @ w.T
    assert got.dtype == torch.bfloat16 and got.shape == (2, n)
    _within_a_bf16_ulp(got, ref)


@pytest.mark.parametrize("qtype", [T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS], ids=lambda t: t.name)
@pytest.mark.parametrize("x_repeat", [1, 2])
def test_the_word_gemv_gathers_the_routed_experts(qtype: GGMLQuantizationType, x_repeat: int) -> None:
    experts, n, k = 4, 6, 512  # Qwen3.6's expert down: K 512, four sets of rows a warp
    raw = np.stack([_random_rows(qtype, rows=n, k=k, seed=7 * int(qtype) + e) for e in range(experts)])
    w = torch.stack([_dense(r, qtype) for r in raw])  # (E, N, K)
    index = torch.tensor([3, 0, 3, 1])  # (M,): expert 3 twice, 2 never read
    x = torch.randn(4 // x_repeat, k, generator=torch.Generator().manual_seed(x_repeat)).bfloat16()
    got = packed_gemv(x.to(DEVICE), _stack(raw, qtype), index.to(DEVICE), x_repeat=x_repeat).cpu().float()
    ref = torch.stack([w[index[m]] @ x[m // x_repeat].float() for m in range(4)])
    _within_a_bf16_ulp(got, ref)


def test_the_word_gemv_is_chosen_by_type_shape_and_input_dtype_only() -> None:
    from stagewise.kernels.word_gemv_triton import words_config

    assert words_config(T.Q4_K, 4096, False, torch.bfloat16) == (4, 4096, 2)
    assert words_config(T.Q6_K, 14336, False, torch.bfloat16) == (4, 2048, 1)
    assert words_config(T.Q4_K, 1024, False, torch.bfloat16) == (4, 1024, 1)  # two sets of rows a warp
    assert words_config(T.Q4_K, 768, False, torch.bfloat16) is None
    assert words_config(T.Q4_K, 3072, False, torch.bfloat16) is None
    assert words_config(T.Q4_K, 2048, True, torch.bfloat16) == (4, 2048, 1)  # routed experts take the same tiles
    assert words_config(T.Q6_K, 4096, False, torch.float16) is None
    assert words_config(T.Q5_K, 4096, False, torch.bfloat16) == (4, 4096, 2)
    assert words_config(T.IQ4_XS, 4096, False, torch.bfloat16) == (4, 4096, 2)
    assert words_config(T.IQ4_NL, 4096, False, torch.bfloat16) is None
    assert words_config(T.Q3_K, 14336, False, torch.bfloat16) == (4, 2048, 1)


def test_the_word_ptx_makes_128_plus_each_byte_in_float32() -> None:
    """The word GEMV's inline PTX (not run by the interpreter), instruction by instruction: byte ``j`` (below
    128) of a word gives float32 ``128 + byte`` in output ``j``."""
    import struct

    from test_packed_decode import _run_ptx

    from stagewise.kernels import word_gemv_triton as kernels

    rng = np.random.default_rng(0)
    for word in [0, 0x7F7F7F7F, 0x0F0F0F0F, 0x3F003F00, *rng.integers(0, 2**32, size=64).tolist()]:
        word = int(word) & 0x7F7F7F7F
        out = _run_ptx(kernels.BYTES_ASM.value, {"$4": word})
        got = [struct.unpack("<f", struct.pack("<I", out[f"${j}"]))[0] for j in range(4)]
        assert got == [128.0 + ((word >> (8 * j)) & 0xFF) for j in range(4)]


def test_the_iq4_ptx_makes_128_plus_each_codebook_entry_in_float32() -> None:
    """The word GEMV's IQ4 lookup (inline PTX), instruction by instruction: every nibble of a word, low ones in
    outputs 0-3 and high ones in 4-7, gives float32 ``128 + kvalues[n]`` exactly."""
    import struct

    from test_packed_decode import _run_ptx

    from stagewise.kernels import word_gemv_triton as kernels

    kvalues = gguf.quants.IQ4_NL.kvalues
    rng = np.random.default_rng(1)
    words = [sum(((4 * i + j) % 16 | ((15 - 4 * i - j) % 16) << 4) << (8 * j) for j in range(4)) for i in range(4)]
    tables = {f"${9 + i}": v & 0xFFFFFFFF for i, v in enumerate(kernels.IQ4_TABLES)}
    for word in [*words, *rng.integers(0, 2**32, size=64).tolist()]:
        out = _run_ptx(kernels.CODEBOOK_ASM.value, {"$8": int(word), **tables})
        got = [struct.unpack("<f", struct.pack("<I", out[f"${i}"]))[0] for i in range(8)]
        q = [(int(word) >> (8 * j)) & 0xFF for j in range(4)]
        assert got == [128.0 + kvalues[b & 15] for b in q] + [128.0 + kvalues[b >> 4] for b in q]
