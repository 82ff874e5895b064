"""make-model: presets, determinism, both formats, tokenizer, CLI."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
import torch

from stagewise.cli import cmd_make_model
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError, ModelNotFound
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.make_model import load_hf_config, make_model, preset_names
from stagewise.weights.safetensors_source import SafetensorsSource

REQUIRED_PRESETS = {"demo", "tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3.5", "tiny-qwen3.6",
                    "llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "qwen3-30b-a3b", "qwen3.5-4b", "qwen3.6-35b-a3b"}


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def test_presets_are_packaged() -> None:
    assert REQUIRED_PRESETS <= set(preset_names())


@pytest.mark.parametrize(("fmt", "dtype"), [("gguf", "q8_0"), ("gguf", "bf16"), ("safetensors", "f32")])
def test_same_seed_same_bytes(tmp_path: Path, fmt: str, dtype: str) -> None:
    outs = []
    for run, seed in (("a", 7), ("b", 7), ("c", 8)):
        out = tmp_path / run / ("m.gguf" if fmt == "gguf" else "st")
        make_model("tiny-qwen3.6", out, fmt, dtype, seed=seed)
        outs.append(_digest([p for p in (tmp_path / run).rglob("*") if p.is_file()]))
    assert outs[0] == outs[1] != outs[2]


def test_demo_preset_and_tokenizer_in_both_formats(tmp_path: Path) -> None:
    gguf_path = make_model("demo", tmp_path / "demo.gguf", "gguf", "bf16", seed=0)
    st_dir = make_model("demo", tmp_path / "demo", "safetensors", "bf16", seed=0)
    source = GGUFSource(gguf_path)
    config = ModelConfig.from_path(st_dir)
    assert config == source.config and config.architecture in ("llama", "qwen3")
    assert 64 <= config.hidden_size <= 128 and config.num_layers == 4
    from_gguf = Tokenizer.from_gguf_fields(source.fields)
    from_dir = Tokenizer.from_dir(st_dir)
    assert from_gguf.vocab_size == from_dir.vocab_size == config.vocab_size
    text = "<|im_start|>user\nHello, world! 123<|im_end|>\n"
    assert from_gguf.encode(text) == from_dir.encode(text)
    assert config.eos_token_ids == (from_dir.token_to_id("<|im_end|>"),)
    assert source.fields["tokenizer.chat_template"]


@pytest.mark.parametrize("preset", ["tiny-qwen3-moe", "tiny-qwen3.5"])
def test_safetensors_output_loads_in_transformers(tmp_path: Path, preset: str) -> None:
    import transformers

    from stagewise.models.registry import build_stage
    from stagewise.weights.stage_loader import load_stage

    st_dir = make_model(preset, tmp_path / "st", "safetensors", "f32", seed=3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(st_dir, dtype=torch.float32).eval()
    config = ModelConfig.from_path(st_dir)
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, SafetensorsSource(st_dir), torch.device("cpu"), torch.float32)
    prompt = torch.arange(9)[None] * 7
    with torch.no_grad():
        ref = hf(prompt).logits
        got = stage(prompt, torch.arange(9)[None], stage.new_states(1, 32, torch.float32, torch.device("cpu")),
                    start=0, all_logits=True).logits
    assert float((got - ref).norm() / ref.norm()) <= 1e-5


def test_safetensors_shards_with_index(tmp_path: Path) -> None:
    st_dir = make_model("tiny-qwen3", tmp_path / "st", "safetensors", "f32", seed=4, split_max_bytes=100_000)
    shards = sorted(st_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (st_dir / "model.safetensors.index.json").exists()
    assert all(p.stat().st_size <= 131_072 + 4096 for p in shards)  # the limit, or one tensor larger than it
    whole = make_model("tiny-qwen3", tmp_path / "one", "safetensors", "f32", seed=4)
    a, b = SafetensorsSource(st_dir), SafetensorsSource(whole)
    assert a.names() == b.names()
    for name in a.names():
        assert torch.equal(a.load(name, torch.device("cpu"), torch.float32), b.load(name, torch.device("cpu"), torch.float32))


def test_bad_requests_are_typed(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="no-such-preset"):
        make_model("no-such-preset", tmp_path / "m.gguf")
    with pytest.raises(ConfigError):
        make_model("tiny-qwen3", tmp_path / "st", "safetensors", "q8_0")
    with pytest.raises(ConfigError):
        make_model("tiny-qwen3", tmp_path / "m.gguf", "onnx", "f32")


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cmd_make_model.register(parser.add_subparsers())
    args = parser.parse_args(["make-model", "--config", "tiny-llama", "--format", "gguf", "--dtype", "q8_0",
                              "--seed", "3", str(tmp_path / "x.gguf")])
    assert args.func(args) == 0
    assert "x.gguf" in capsys.readouterr().out
    source = GGUFSource(tmp_path / "x.gguf")
    assert source.config.architecture == "llama" and source.config.rope.rope_type == "llama3"


def test_gguf_lists_every_vocabulary_entry(tmp_path: Path) -> None:
    """llama.cpp refuses a token list shorter than the embedding: rows past the demo tokenizer's
    trained tokens are ordinary ``<|extra_N|>`` tokens (type 1), so every sampled id streams text."""
    config = load_hf_config("tiny-qwen3") | {"vocab_size": 6000}
    source = GGUFSource(make_model(config, tmp_path / "m.gguf", "gguf", "f16", seed=1))
    tokens, types = source.fields["tokenizer.ggml.tokens"], source.fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == 6000 == source.config.vocab_size
    assert tokens[-1] == "<|extra_4975|>" and types[-1] == 1
    tokenizer = Tokenizer.from_gguf_fields(source.fields)
    assert tokenizer.encode("hello world") and tokenizer.decode([5999]) == "<|extra_4975|>"


@pytest.mark.parametrize("preset", ["tiny-qwen3.5", "qwen3.5-4b", "qwen3.6-35b-a3b"])
def test_qwen35_gguf_has_rope_sections(tmp_path: Path, preset: str) -> None:
    """llama.cpp refuses a qwen35 / qwen35moe GGUF without ``rope.dimension_sections``; ours match
    the preset's own ``mrope_section`` (what the converter writes)."""
    from stagewise.weights.gguf_export import mrope_sections

    raw = load_hf_config(preset)
    sections = raw["rope_parameters"]["mrope_section"]
    config = ModelConfig.from_hf_dict(raw, source=preset)
    assert mrope_sections(config.rotary_dim) == [*sections, 0]
    if preset.startswith("tiny-"):
        source = GGUFSource(make_model(preset, tmp_path / "m.gguf", "gguf", "f32", seed=1))
        arch = source.fields["general.architecture"]
        assert source.fields[f"{arch}.rope.dimension_sections"] == [*sections, 0]
