"""GGUF reader: config from metadata, name/layout maps, split files, zero-copy reads, tensor types, spec."""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType

from stagewise.errors import ModelNotFound, UnsupportedTensorType
from stagewise.models.registry import build_stage
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_layout import row_index
from stagewise.weights.gguf_names import NameRule
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.gguf_spec import model_spec_from_gguf
from stagewise.weights.make_model import load_hf_config, make_model, model_params
from stagewise.weights.open_source import open_source
from stagewise.weights.stage_loader import load_stage

CPU = torch.device("cpu")


def _converter_permute(weights: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, as the reference."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (6, 6, 8), (8, 1, 64)])
def test_llama_qk_permutation_round_trip(heads: int, kv_heads: int, head_dim: int) -> None:
    config = ModelConfig.from_hf_dict(dict(model_type="llama", hidden_size=heads * head_dim, num_hidden_layers=1,
                                           num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=10))
    for layout, n in (("llama_q", heads), ("llama_k", kv_heads)):
        ours = torch.randn(n * head_dim, 24)
        stored = _converter_permute(ours, n)
        index = row_index(NameRule("x", ("y",), layout=layout), config, stored.shape[0])
        assert index is not None and torch.equal(stored[index], ours)
        assert not torch.equal(stored, ours)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3.5", "tiny-qwen3.6"])
def test_config_from_gguf_equals_hf_config(tmp_path: Path, preset: str) -> None:
    path = make_model(preset, tmp_path / "m.gguf", "gguf", "bf16", seed=1)
    st = make_model(preset, tmp_path / "st", "safetensors", "bf16", seed=1)
    assert GGUFSource(path).config == ModelConfig.from_path(st)


def test_split_gguf_reads_as_one(tmp_path: Path) -> None:
    whole = GGUFSource(make_model("tiny-qwen3.6", tmp_path / "one" / "m.gguf", "gguf", "q8_0", seed=2))
    first = make_model("tiny-qwen3.6", tmp_path / "split" / "m.gguf", "gguf", "q8_0", seed=2, split_max_bytes=60_000)
    parts = sorted((tmp_path / "split").glob("*.gguf"))
    assert len(parts) > 2 and first.name.endswith(f"-00001-of-{len(parts):05d}.gguf")
    split = open_source(parts[1])  # any part opens the whole model
    assert isinstance(split, GGUFSource)
    assert split.names() == whole.names() and split.config == whole.config
    for name in sorted(whole.names()):
        assert torch.equal(split.load(name, CPU, torch.float32), whole.load(name, CPU, torch.float32)), name
        if whole.is_quantized(name):
            a, b = split.load_q8_0(name, CPU), whole.load_q8_0(name, CPU)
            assert torch.equal(a.qs, b.qs) and torch.equal(a.scales, b.scales)
    parts[-1].unlink()
    with pytest.raises(ModelNotFound, match="missing"):
        GGUFSource(first)


def test_f32_on_cpu_is_a_view_of_the_file(tmp_path: Path) -> None:
    source = GGUFSource(make_model("tiny-qwen3", tmp_path / "m.gguf", "gguf", "f32", seed=3))
    name = "model.layers.0.mlp.down_proj.weight"
    a = source.load(name, CPU, torch.float32)
    b = source.load(name, CPU, torch.float32)
    assert a.data_ptr() == b.data_ptr()  # both view the mapping: no copy
    assert source.load(name, CPU, torch.bfloat16).data_ptr() != a.data_ptr()


def _rewrite(src: Path, dst: Path, types: dict[str, GGMLQuantizationType]) -> None:
    """Copy a (valid) GGUF, storing the named tensors in other types."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        qtype = types.get(t.name)
        if qtype is None:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        elif qtype in (GGMLQuantizationType.IQ4_NL, GGMLQuantizationType.NVFP4):  # any bytes of the right size: never decoded
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((shape[0], shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(t.name, raw, raw_dtype=qtype)
        else:
            values = gguf.quants.dequantize(np.array(t.data), t.tensor_type).reshape(shape)
            writer.add_tensor(t.name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_mixed_packed_types_load_exactly(tmp_path: Path) -> None:
    src = make_model("tiny-qwen3", tmp_path / "m.gguf", "gguf", "f32", seed=4)
    types = {"blk.0.ffn_down.weight": GGMLQuantizationType.Q4_0, "blk.0.ffn_up.weight": GGMLQuantizationType.Q5_1,
             "blk.1.ffn_gate.weight": GGMLQuantizationType.Q4_1, "blk.1.attn_v.weight": GGMLQuantizationType.Q5_0}
    _rewrite(src, tmp_path / "mixed.gguf", types)
    source = GGUFSource(tmp_path / "mixed.gguf")
    reader = gguf.GGUFReader(tmp_path / "mixed.gguf")
    ours = {"blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
            "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
            "blk.1.ffn_gate.weight": "model.layers.1.mlp.gate_proj.weight",
            "blk.1.attn_v.weight": "model.layers.1.self_attn.v_proj.weight"}
    for t in reader.tensors:
        if t.name in types:
            ref = gguf.quants.dequantize(np.array(t.data), t.tensor_type)
            assert source.is_quantized(ours[t.name])  # each tensor stays packed in its own type
            assert np.array_equal(source.load(ours[t.name], CPU, torch.float32).numpy(), ref)
            packed = source.load_quantized(ours[t.name], CPU)
            assert packed.format_name == t.tensor_type.name.lower() and torch.equal(
                packed.dequantize(torch.float32), torch.from_numpy(ref))
    stage = build_stage(source.config, 0, source.config.num_layers, entry=True, exit=True)
    load_stage(stage, source, CPU, torch.float32)  # mixed types load; dispatch is per tensor


def test_unsupported_type_is_named(tmp_path: Path) -> None:
    src = make_model("tiny-qwen3", tmp_path / "m.gguf", "gguf", "f32", seed=5)
    _rewrite(src, tmp_path / "q2.gguf", {"blk.1.ffn_up.weight": GGMLQuantizationType.NVFP4})
    with pytest.raises(UnsupportedTensorType, match=r"blk\.1\.ffn_up\.weight.*NVFP4"):
        GGUFSource(tmp_path / "q2.gguf")


@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-qwen3.6"])  # untied: see report on tied heads
def test_spec_from_gguf_matches_loaded_bytes(tmp_path: Path, preset: str) -> None:
    path = make_model(preset, tmp_path / "m.gguf", "gguf", "q8_0", seed=6)
    spec = model_spec_from_gguf(path, run_dtype="f32")
    source = GGUFSource(path)
    stage = build_stage(source.config, 0, source.config.num_layers, entry=True, exit=True)
    load_stage(stage, source, CPU, torch.float32)
    assert spec.format == "q8_0" and spec.num_blocks == source.config.num_layers
    assert spec.weight_bytes == stage.resident_bytes()


def test_real_preset_geometry_builds_on_meta() -> None:
    raw = load_hf_config("qwen3.6-35b-a3b")
    config = ModelConfig.from_hf_dict(raw)
    assert config.architecture == "qwen3_5_moe" and config.num_layers == 40 and config.num_experts == 256
    params = dict(model_params(config))  # on meta: no memory
    assert params["model.layers.0.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert 34e9 < sum(math.prod(s) for s in params.values()) < 36e9


def test_shared_expert_gate_stored_1d_loads(tmp_path: Path) -> None:
    """llama.cpp accepts ``ffn_gate_inp_shexp`` as (h,) as well as (1, h): so do we, with equal values."""
    src = make_model("tiny-qwen3.6", tmp_path / "m.gguf", "gguf", "f32", seed=8)
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(tmp_path / "flat.gguf", reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    flattened = 0
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name.endswith("ffn_gate_inp_shexp.weight"):
            data, flattened = data.reshape(-1), flattened + 1
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert flattened > 0
    assert [len(t.shape) for t in gguf.GGUFReader(tmp_path / "flat.gguf").tensors
            if t.name.endswith("ffn_gate_inp_shexp.weight")] == [1] * flattened
    states = []
    for path in (src, tmp_path / "flat.gguf"):
        source = GGUFSource(path)
        stage = build_stage(source.config, 0, source.config.num_layers, entry=True, exit=True)
        load_stage(stage, source, CPU, torch.float32)
        states.append(stage.state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
