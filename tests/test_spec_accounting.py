"""Accounting formulas: formats, parameter counts, state, workspace and stage charges."""

from __future__ import annotations

import glob

import pytest

from stagewise.errors import ConfigError
from stagewise.placement.stage_table import StageTable
from stagewise.spec.charge import stage_charge
from stagewise.spec.formats import stored_format, tensor_bytes
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.state_bytes import block_state_bytes
from stagewise.spec.tensor_shapes import block_tensors

REF = "/work/shared/reference/models"


def cfg(name: str) -> ModelConfig:
    return ModelConfig.from_path(f"{REF}/{name}.json")


def test_q8_0_is_34_bytes_per_32() -> None:
    assert tensor_bytes((4096, 4096), stored_format("q8_0")) == 4096 * 4096 // 32 * 34
    assert tensor_bytes((10, 256), stored_format("q4_k")) == 10 * 144
    assert tensor_bytes((3, 33), stored_format("q8_0")) == 3 * 33 * 2  # ragged row: f16 fallback
    with pytest.raises(ConfigError):
        stored_format("q9_9")


def test_llama_8b_bf16_matches_parameter_count() -> None:
    spec = ModelSpec.from_config(cfg("llama-3.1-8b"), "bf16")
    # Llama-3.1-8B: 8.03 B parameters, plus the float32 rotary frequencies a stage keeps (64 of them)
    assert spec.weight_bytes == 2 * 8_030_261_248 + 64 * 4


def test_qwen36_q8_0_weights_and_rfc_shape() -> None:
    c = cfg("qwen3.6-35b-a3b")
    spec = ModelSpec.from_config(c, "q8_0")
    assert 36e9 < spec.weight_bytes < 38.2e9  # RFC's UD-Q8_K_XL file keeps some tensors wider: 38.14 GB
    names = {t.name: t.shape for t in block_tensors(c, 3)}
    assert names["q_proj"] == (2 * 16 * 256, 2048)  # query + output gate
    assert names["experts.gate_proj"] == (256, 512, 2048)
    lin = {t.name: t.shape for t in block_tensors(c, 0)}
    assert lin["in_proj_qkv"] == (2 * 16 * 128 + 32 * 128, 2048)
    assert lin["conv1d"] == (8192, 1, 4)
    block = spec.blocks[0]
    assert block.read_bytes_per_token < block.weight_bytes / 10  # top-8 of 256 experts


def test_state_formulas() -> None:
    c = cfg("qwen3.6-35b-a3b")
    spec = ModelSpec.from_config(c, "q8_0")
    p = Profile(context_tokens=1000, batch=3, activation_dtype="bf16")
    attn, lin = spec.blocks[3], spec.blocks[0]
    blocks = 3 * 16 + 1  # 3 sequences x ceil(1000 / 64) blocks + the scratch block
    assert block_state_bytes(attn, p) == blocks * 64 * 2 * c.num_kv_heads * c.head_dim * 2  # key + value, bf16
    pooled = Profile(context_tokens=1000, batch=3, activation_dtype="bf16", kv_tokens=1000)  # 16 blocks shared
    assert block_state_bytes(attn, pooled) == (16 + 1) * 64 * 2 * c.num_kv_heads * c.head_dim * 2
    assert block_state_bytes(lin, pooled) == block_state_bytes(lin, p)  # recurrent state stays one slot per row
    conv = c.linear_conv_dim * c.linear_conv_kernel_dim * 2  # one entry's window, bf16
    rec = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4  # one entry's state, f32
    assert block_state_bytes(lin, p) == (1 + 2 * 3) * (conv + rec)  # the zero entry + two per row


def test_tied_embeddings_charged_once_per_owner() -> None:
    spec = ModelSpec.from_config(cfg("qwen3.5-4b"), "bf16")
    p = Profile()
    whole = stage_charge(spec, p, 0, spec.num_blocks, True, True)
    a = stage_charge(spec, p, 0, 10, True, False)
    b = stage_charge(spec, p, 10, spec.num_blocks, False, True)
    # the head copy, and the rotary table each stage keeps
    assert a.weights_bytes + b.weights_bytes == whole.weights_bytes + spec.entry.weight_bytes + spec.stage_table_bytes


def test_exact_block_bytes_override() -> None:
    c = cfg("qwen3-8b")
    exact = {i: 1000 + i for i in range(c.num_layers)}
    spec = ModelSpec.from_config(c, "q8_0", tensor_bytes_by_block=exact, entry_bytes=7, exit_bytes=9)
    assert [b.weight_bytes for b in spec.blocks] == list(exact.values())
    assert spec.entry.weight_bytes == 7 and spec.exit.weight_bytes == 9
    with pytest.raises(ConfigError):
        ModelSpec.from_config(c, "q8_0", tensor_bytes_by_block={0: 1})


@pytest.mark.parametrize("path", sorted(glob.glob(f"{REF}/*.json")))
@pytest.mark.parametrize("fmt", ["bf16", "q8_0", "q4_k"])
def test_table_equals_stage_charge(path: str, fmt: str) -> None:
    spec = ModelSpec.from_config(ModelConfig.from_path(path), fmt)
    p = Profile(context_tokens=2048, batch=2, prefill_chunk_tokens=256)
    table = StageTable.build(spec, p)
    n = spec.num_blocks
    for a, b, entry, exit in [(0, n, True, True), (0, n // 2, True, False), (n // 2, n, False, True), (1, 3, False, False)]:
        assert table.range_total(a, b, entry, exit) == stage_charge(spec, p, a, b, entry, exit).total_bytes


def test_profile_validation() -> None:
    with pytest.raises(ConfigError, match="context_tokens"):
        Profile(context_tokens=0)
    with pytest.raises(ConfigError):
        Profile(activation_dtype="int8")
    assert Profile(context_tokens=100, prefill_chunk_tokens=512).chunk_tokens == 100
