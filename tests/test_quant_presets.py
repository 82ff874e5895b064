"""llama.cpp's per-tensor types per preset, and the predicted weights of reference geometries.

The expected sizes are derived here, independently of :mod:`stagewise.spec.quant_presets`, from
``llama_tensor_get_type`` in llama.cpp's ``src/llama-quant.cpp``: for Q4_K_M every matrix is Q4_K
(144 bytes / 256 values) except ``output.weight`` (Q6_K, 210 / 256) and ``attn_v`` / ``attn_qkv``
/ ``ffn_down*`` of the layers where ``use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3
== 2`` (Q6_K); 1-D tensors, ``ffn_gate_inp`` and ``ssm_conv1d`` stay F32 (4 bytes). Published
Q4_K_M files of these models: Llama-3.1-8B 4.92 GB, Llama-3.1-70B 42.5 GB, Qwen3-30B-A3B 18.6 GB
(file size = tensors + a few MB of metadata and tokenizer).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as T

from stagewise.errors import ConfigError
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.quant_presets import QuantModel, preset, tensor_type

REF = Path("/work/shared/reference/models")
Q4K, Q6K, F32 = 144 / 256, 210 / 256, 4  # bytes per value


def cfg(name: str) -> ModelConfig:
    return ModelConfig.from_path(REF / f"{name}.json")


def more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def test_llama_8b_q4_k_m_types() -> None:
    m = QuantModel.from_config(cfg("llama-3.1-8b"))
    assert tensor_type("q4_k_m", "output.weight", (128256, 4096), m) == T.Q6_K
    assert tensor_type("q4_k_m", "token_embd.weight", (128256, 4096), m) == T.Q4_K
    assert tensor_type("q4_k_m", "blk.0.attn_v.weight", (1024, 4096), m) == T.Q6_K
    assert tensor_type("q4_k_m", "blk.4.attn_v.weight", (1024, 4096), m) == T.Q4_K
    assert tensor_type("q4_k_m", "blk.6.ffn_down.weight", (4096, 14336), m) == T.Q6_K  # (6 - 4) % 3 == 2
    assert tensor_type("q4_k_m", "blk.5.attn_q.weight", (4096, 4096), m) == T.Q4_K
    assert tensor_type("q4_k_m", "blk.5.attn_norm.weight", (4096,), m) == T.F32
    assert tensor_type("q5_k_m", "blk.31.ffn_down.weight", (4096, 14336), m) == T.Q6_K
    assert tensor_type("q8_0", "output.weight", (128256, 4096), m) == T.Q8_0
    assert tensor_type("q4_0", "output.weight", (128256, 4096), m) == T.Q6_K
    assert tensor_type("q2_k", "blk.3.ffn_down.weight", (4096, 14336), m) == T.Q3_K
    assert tensor_type("q2_k", "blk.3.attn_v.weight", (1024, 4096), m) == T.Q4_K  # n_gqa 4
    assert tensor_type("q3_k_m", "blk.1.attn_v.weight", (1024, 4096), m) == T.Q5_K
    assert tensor_type("q3_k_m", "blk.2.attn_v.weight", (1024, 4096), m) == T.Q4_K
    assert tensor_type("q3_k_m", "blk.9.attn_output.weight", (4096, 4096), m) == T.Q4_K
    assert tensor_type("iq4_xs", "blk.9.attn_v.weight", (1024, 4096), m) == T.Q5_K
    assert tensor_type("iq4_xs", "blk.2.ffn_down.weight", (4096, 14336), m) == T.Q5_K  # i < n/8


def test_fallbacks_moe_and_70b() -> None:
    m = QuantModel.from_config(cfg("qwen3-30b-a3b"))
    assert tensor_type("q4_k_m", "blk.0.ffn_gate_inp.weight", (128, 2048), m) == T.F32  # router
    assert tensor_type("q4_k_m", "blk.0.ffn_down_exps.weight", (128, 2048, 768), m) == T.Q6_K  # more bits
    assert tensor_type("q4_k_m", "blk.7.ffn_down_exps.weight", (128, 2048, 768), m) == T.Q4_K
    # rows of 800 do not divide into 256: Q4_K -> Q5_0, Q6_K -> Q8_0
    assert tensor_type("q4_k_m", "blk.7.ffn_down_exps.weight", (128, 2048, 800), m) == T.Q5_0
    assert tensor_type("q4_k_m", "blk.1.ffn_down_exps.weight", (128, 2048, 800), m) == T.Q8_0
    assert tensor_type("q3_k_m", "blk.20.ffn_up_exps.weight", (128, 768, 2016), m) == T.Q4_0  # 2016 % 256
    assert tensor_type("iq4_xs", "blk.20.ffn_up_exps.weight", (128, 768, 2000), m) == T.F16  # 2000 % 32
    assert tensor_type("iq4_xs", "blk.20.ffn_up_exps.weight", (128, 768, 2016), m) == T.IQ4_NL
    assert tensor_type("mxfp4_moe", "blk.2.ffn_up_exps.weight", (128, 768, 2048), m) == T.MXFP4
    assert tensor_type("mxfp4_moe", "blk.2.attn_q.weight", (4096, 2048), m) == T.Q8_0
    big = QuantModel.from_config(cfg("llama-3.1-70b"))
    assert big.is_70b
    assert tensor_type("q4_k_m", "blk.10.attn_v.weight", (1024, 8192), big) == T.Q5_K  # 70B: Q4_K -> Q5_K
    hybrid = QuantModel.from_config(cfg("qwen3.6-35b-a3b"))
    assert tensor_type("q4_k_m", "blk.0.attn_qkv.weight", (8192, 2048), hybrid) == T.Q6_K  # attn_v-like
    assert tensor_type("q4_k_m", "blk.0.ssm_conv1d.weight", (8192, 4), hybrid) == T.F32
    with pytest.raises(ConfigError, match="q9_k"):
        preset("q9_k")


def _llama_q4_k_m_bytes(c: ModelConfig) -> float:
    h, inter, kv, n, v = c.hidden_size, c.intermediate_size, c.num_kv_heads * c.head_dim, c.num_layers, c.vocab_size
    total = v * h * Q4K + v * h * Q6K + h * F32  # token_embd, output, output_norm
    for i in range(n):
        total += (h * h + kv * h + h * h + 2 * inter * h) * Q4K + 2 * h * F32  # q, k, o, gate, up; 2 norms
        v_bits = Q6K if more_bits(i, n) else (Q4K if c.num_layers != 80 else 176 / 256)  # 70B: Q5_K
        total += kv * h * v_bits + inter * h * (Q6K if more_bits(i, n) else Q4K)  # attn_v, ffn_down
    return total


@pytest.mark.parametrize(("model", "file_gb"), [("llama-3.1-8b", 4.92), ("llama-3.1-70b", 42.5)])
def test_llama_q4_k_m_predicted_bytes(model: str, file_gb: float) -> None:
    c = cfg(model)
    spec = ModelSpec.from_config(c, "q4_k_m")
    predicted = spec.weight_bytes - spec.stage_table_bytes  # the file's tensors (not the rotary table a stage adds)
    assert predicted == pytest.approx(_llama_q4_k_m_bytes(c), rel=1e-9)
    assert predicted == pytest.approx(file_gb * 1e9, rel=0.01)  # within 1 % of the published file


def test_llama_8b_q4_k_m_is_4_58_gib() -> None:
    assert ModelSpec.from_config(cfg("llama-3.1-8b"), "q4_k_m").weight_bytes / 2**30 == pytest.approx(4.576, abs=0.005)


def test_moe_q4_k_m_predicted_bytes() -> None:
    # Qwen3-30B-A3B: 48 layers, 128 experts of 768 per layer; published Q4_K_M file 18.6 GB
    c = cfg("qwen3-30b-a3b")
    assert ModelSpec.from_config(c, "q4_k_m").weight_bytes == pytest.approx(18.6e9, rel=0.01)
    q36 = ModelSpec.from_config(cfg("qwen3.6-35b-a3b"), "q4_k_m").weight_bytes
    assert 20.5e9 < q36 < 21.6e9  # ~21 GB: the size of the Q4_K_M files people download
