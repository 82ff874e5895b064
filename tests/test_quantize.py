"""Quantizers of every packed type: gguf.quants' bytes where it has a quantizer, valid blocks and a
bounded round-trip error where it has not, and make-model files in those types."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from stagewise.errors import ConfigError
from stagewise.spec.packed_types import PACKED
from stagewise.weights.quant import quantize as quantize_module
from stagewise.weights.quant.dequant import dequantize
from stagewise.weights.quant.quantize import QUANTIZERS, quantize

T = GGMLQuantizationType
GGUF_QUANTIZED = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]  # gguf.quants.quantize implements these
# relative round-trip error |dequantize(quantize(x)) - x| / |x| on N(0, 1) rows; measured (256 x 1024,
# seed 0): Q2_K 0.271, Q3_K 0.144, Q4_K 0.071, Q5_K 0.036, Q6_K 0.017, IQ4_NL 0.075, IQ4_XS 0.076,
# and for the gguf.quants ones Q4_0 0.086, Q4_1 0.079, Q5_0 0.043, Q5_1 0.038, Q8_0 0.0054, MXFP4 0.115
MAX_REL_ERR = {T.Q2_K: 0.30, T.Q3_K: 0.16, T.Q4_K: 0.08, T.Q5_K: 0.04, T.Q6_K: 0.02, T.IQ4_NL: 0.085,
               T.IQ4_XS: 0.085, T.Q4_0: 0.095, T.Q4_1: 0.087, T.Q5_0: 0.048, T.Q5_1: 0.042, T.Q8_0: 0.006,
               T.MXFP4: 0.125}


def _rows(rows: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))


def _round_trip(values: torch.Tensor, qtype: GGMLQuantizationType) -> tuple[torch.Tensor, np.ndarray]:
    blocks = quantize(values, qtype)
    ref = gguf.quants.dequantize(blocks.numpy(), qtype)  # the format's own reading of our bytes
    assert torch.equal(dequantize(blocks.reshape(-1), qtype, tuple(values.shape)), torch.from_numpy(ref))
    return blocks, ref


def test_every_packed_type_has_a_quantizer() -> None:
    assert set(QUANTIZERS) == PACKED


@pytest.mark.parametrize("qtype", GGUF_QUANTIZED, ids=lambda t: t.name)
def test_bytes_equal_gguf_quants(qtype: GGMLQuantizationType) -> None:
    values = _rows(64, 256, 3) * torch.logspace(-4, 1, 64)[:, None]  # scales over five decades
    values[3] = 0.0  # an all-zero block
    values[5, :32] = 0.5  # a constant block; exact halves
    values[6, :32] = -2.0
    values[7, 32:64] = torch.arange(32) / 4 - 4  # quarter steps: ties in every rounding
    values[8, 64:96] = 1e-30  # f16 scales underflow to 0 (the codes still follow the float32 scale)
    ours = quantize(values, qtype)
    ref = gguf.quants.quantize(values.numpy(), qtype)
    block, type_bytes = GGML_QUANT_SIZES[qtype]
    assert ours.shape == (64, 256 // block * type_bytes) and ours.dtype == torch.uint8
    assert np.array_equal(ours.numpy(), ref)


def test_q8_0_helper_matches_gguf() -> None:
    from stagewise.weights.quant.quantize import quantize_q8_0

    values = _rows(8, 64, 4)
    ref = gguf.quants.quantize(values.numpy(), T.Q8_0).reshape(-1, 34)
    assert np.array_equal(quantize_q8_0(values).numpy(), ref)


@pytest.mark.parametrize("qtype", sorted(PACKED, key=int), ids=lambda t: t.name)
def test_round_trip_error_is_bounded(qtype: GGMLQuantizationType) -> None:
    values = _rows(256, 1024, 0)
    _, ref = _round_trip(values, qtype)
    err = float(np.linalg.norm(ref - values.numpy()) / np.linalg.norm(values.numpy()))
    assert err < MAX_REL_ERR[qtype], (qtype.name, err)


@pytest.mark.parametrize("qtype", sorted(PACKED, key=int), ids=lambda t: t.name)
def test_awkward_rows_stay_valid_and_scale_free(qtype: GGMLQuantizationType) -> None:
    k = 512
    values = _rows(12, k, 1)
    values[0] = 0.0  # zeros come back as zeros
    values[1] = 0.75  # a constant row
    values[2] = -values[2].abs()  # one sign only
    values[3] = values[3].abs()
    values[4, ::37] *= 40  # outliers in most blocks
    values[5] *= 1e-3  # small and large magnitudes: the error is relative, whatever the scale
    values[6] *= 1e3
    _, ref = _round_trip(values, qtype)
    assert np.isfinite(ref).all()
    assert (ref[0] == 0).all()
    row_err = np.linalg.norm(ref[1:] - values[1:].numpy(), axis=1) / np.linalg.norm(values[1:].numpy(), axis=1)
    # outlier rows are harder than N(0, 1); the constant and one-signed rows easier
    assert row_err.max() < max(2.5 * MAX_REL_ERR[qtype], 0.05), (qtype.name, row_err)


@pytest.mark.parametrize("qtype", [T.Q3_K, T.Q4_K, T.IQ4_XS, T.MXFP4], ids=lambda t: t.name)
def test_deterministic_and_chunk_free(qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch) -> None:
    values = _rows(40, 512, 2)
    whole = quantize(values, qtype)
    assert torch.equal(quantize(values.clone(), qtype), whole)
    monkeypatch.setattr(quantize_module, "CHUNK_ELEMENTS", 256 * 3)  # three 256-blocks per chunk
    assert torch.equal(quantize(values, qtype), whole)
    assert torch.equal(quantize(values.double(), qtype), whole)  # float32 arithmetic whatever comes in


def test_bad_input_is_refused() -> None:
    with pytest.raises(ConfigError, match="IQ2_XS"):
        quantize(torch.zeros(2, 256), T.IQ2_XS)
    with pytest.raises(ValueError, match=r"Q4_K needs .* multiple of 256"):
        quantize(torch.zeros(2, 96), T.Q4_K)
    bad = torch.zeros(2, 256)
    bad[1, 7] = float("nan")
    with pytest.raises(ValueError, match="Q6_K: cannot quantize NaN"):
        quantize(bad, T.Q6_K)


# tiny-llama made wide enough for 256-blocks: rows of 256 (attention, gate/up, embeddings, output)
# take the K type, ffn_down's rows of 320 take llama.cpp's fallback (Q4_K -> Q5_0, Q6_K -> Q8_0)
_WIDE_LLAMA = {"hidden_size": 256, "intermediate_size": 320, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 64, "num_hidden_layers": 2}


@pytest.mark.parametrize(("dtype", "qtype", "fallback", "file_type"), [
    ("q4_k", T.Q4_K, T.Q5_0, gguf.LlamaFileType.MOSTLY_Q4_K_S),
    ("q6_k", T.Q6_K, T.Q8_0, gguf.LlamaFileType.MOSTLY_Q6_K),
    ("iq4_xs", T.IQ4_XS, T.IQ4_NL, gguf.LlamaFileType.MOSTLY_IQ4_XS),
])
def test_make_model_writes_k_types(tmp_path: Path, dtype: str, qtype: GGMLQuantizationType,
                                   fallback: GGMLQuantizationType, file_type: gguf.LlamaFileType) -> None:
    from stagewise.spec.model_config import ModelConfig
    from stagewise.spec.quant_presets import QuantModel, tensor_type
    from stagewise.weights.gguf_file import GGUFFile
    from stagewise.weights.make_model import load_hf_config, make_model

    config = {**load_hf_config("tiny-llama"), **_WIDE_LLAMA}
    dense = make_model(config, tmp_path / "f32.gguf", dtype="f32", seed=7)
    packed = make_model(config, tmp_path / f"{dtype}.gguf", dtype=dtype, seed=7)
    ref = {t.name: t for t in gguf.GGUFReader(dense).tensors}
    reader = gguf.GGUFReader(packed)
    assert int(reader.fields["general.file_type"].parts[-1][0]) == int(file_type)
    ours = GGUFFile(packed)
    seen = set()
    for t in reader.tensors:
        info = ours.info(t.name)
        assert info.ggml_type == t.tensor_type
        if len(info.shape) < 2:
            assert t.tensor_type == T.F32
            continue
        expected = fallback if t.name.endswith("ffn_down.weight") else qtype
        if t.name == "output.weight":  # llama.cpp's head rule applies to every quantized type
            expected = tensor_type(dtype, t.name, tuple(info.shape), QuantModel.from_config(ModelConfig.from_hf_dict(config)))
        assert t.tensor_type == expected, t.name
        seen.add(expected)
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(info.shape)
        want = ref[t.name].data.reshape(info.shape)
        assert torch.equal(dequantize(ours.raw(t.name), info.ggml_type, info.shape), torch.from_numpy(values))
        err = float(np.linalg.norm(values - want) / np.linalg.norm(want))
        assert err < 1.5 * MAX_REL_ERR[expected], (t.name, err)
    assert {qtype, fallback} <= seen


def test_tiny_llama_rows_of_64_fall_back(tmp_path: Path) -> None:
    from stagewise.weights.gguf_file import GGUFFile
    from stagewise.weights.make_model import make_model

    path = make_model("tiny-llama", tmp_path / "q2_k.gguf", dtype="q2_k", seed=0)  # rows of 64 and 160
    types = {name: info.ggml_type for name, (_, info) in GGUFFile(path).tensors.items() if len(info.shape) == 2}
    assert types.pop("output.weight") == T.Q8_0  # the head: Q6_K, which falls back to Q8_0 on rows of 64
    assert set(types.values()) == {T.Q4_0}  # llama.cpp's fallback for Q2_K on rows that do not divide into 256
