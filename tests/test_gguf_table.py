"""The torch-free accounting rules equal the loader's: by name (no meta model) and by GGUF header.

``holds_packed`` (a parameter's owner takes packed weights, decided from the name) must agree with
the modules the stage loader asks (``hasattr(owner, "set_quantized_param")``) for every preset
family; :class:`GGUFTable` must read every tensor as :class:`GGUFSource` does (shape, bytes, and
whether it stays packed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.models.registry import build_stage
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.gguf_table import GGUFTable
from stagewise.weights.make_model import load_hf_config, make_model
from stagewise.weights.source_spec import holds_packed

PRESETS = ["tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3.5", "tiny-qwen3.6", "qwen3.6-35b-a3b"]


@pytest.mark.parametrize("preset", PRESETS)
def test_holds_packed_is_the_loaders_owner_rule(preset: str) -> None:
    config = ModelConfig.from_hf_dict(load_hf_config(preset), source=preset)
    model = build_stage(config, 0, config.num_layers, entry=True, exit=True, device="meta")
    modules = dict(model.named_modules())
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert names
    for name in names:
        owner = modules[name.rpartition(".")[0]]
        assert holds_packed(name) == hasattr(owner, "set_quantized_param"), name


@pytest.mark.parametrize(("preset", "dtype"), [("tiny-qwen3-moe", "q4_0"), ("tiny-qwen3.6", "q8_0"),
                                               ("tiny-llama", "f16")])
def test_table_reads_as_the_source(tmp_path: Path, preset: str, dtype: str) -> None:
    path = make_model(preset, tmp_path / "m.gguf", "gguf", dtype, seed=1)
    table, source = GGUFTable(path), GGUFSource(path)
    assert table.config == source.config
    assert table.names() == source.names()
    for name in sorted(source.names()):
        assert table.shape(name) == source.shape(name), name
        assert table.source_bytes(name) == source.source_bytes(name), name
        assert table.is_quantized(name) == source.is_quantized(name), name
    assert any(table.is_quantized(n) for n in table.names()) == (dtype != "f16")
