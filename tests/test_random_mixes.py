"""``random:PRESET@q4_k_m``: random weights in llama.cpp's mix, each tensor in the type a file of that mix stores it in.

A mix puts Llama's ``attn_v``, half of its ``ffn_down`` and the head in Q6_K beside Q4_K (and Qwen3.6's
``ffn_down_exps`` …): the kernels a downloaded Q4_K_M file takes, without writing one first. The types are
make-model's (``weights/gguf_export.stored_types``), the plan charges them without torch
(``source_spec.random_spec``), and loading holds what was charged.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from gguf.constants import GGMLQuantizationType as T

from stagewise.cli.main import main
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_table import GGUFTable
from stagewise.weights.make_model import make_model
from stagewise.weights.preset_configs import load_hf_config
from stagewise.weights.random_source import MIXES, RandomSource
from stagewise.weights.source_spec import random_spec, resident_by_dtype, spec_from_source


def _wide_llama() -> dict[str, Any]:
    """tiny-llama widened so every row divides into 256 values (K-quants stay K-quants), four layers (the mix
    gives every other layer's ``attn_v`` / ``ffn_down`` more bits)."""
    config = dict(load_hf_config("tiny-llama"))
    config.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                  num_hidden_layers=4)
    return config


def test_a_random_mix_draws_each_tensor_in_the_type_its_file_stores(tmp_path: Path) -> None:
    raw = _wide_llama()
    table = GGUFTable(make_model(raw, tmp_path / "m.gguf", "gguf", "q4_k_m", seed=0))
    source = RandomSource(ModelConfig.from_hf_dict(raw, source="wide"), fmt="q4_k_m")
    drawn = {name: source.ggml_type(name) for name in source.names() if source.is_quantized(name)}
    assert Counter(drawn.values()).keys() == {T.Q4_K, T.Q6_K}  # the mix, not one type
    assert drawn["lm_head.weight"] == T.Q6_K and drawn["model.layers.0.self_attn.q_proj.weight"] == T.Q4_K
    for name in source.names():
        if name == "model.embed_tokens.weight":  # random embeddings stay dense (the file's are Q4_K rows)
            assert name not in drawn
            continue
        file_types = table.part_types(name) if table.is_quantized(name) else None
        assert (file_types[0] if file_types else None) == drawn.get(name), name


@pytest.mark.parametrize("preset", ["llama-3.1-8b", "qwen3.6-35b-a3b", "qwen3-30b-a3b", "tiny-qwen3.6"])
@pytest.mark.parametrize("fmt", sorted(MIXES))
def test_the_plan_charges_a_random_mix_as_it_is_drawn(preset: str, fmt: str) -> None:
    config = ModelConfig.from_hf_dict(load_hf_config(preset), source=preset)
    planned = random_spec(config, fmt, "bf16", "m")  # torch-free: what plan / assess charge
    drawn = spec_from_source(config, RandomSource(config, fmt=fmt), "bf16", "m")  # the source's own bytes
    assert [b.weight_bytes for b in planned.blocks] == [b.weight_bytes for b in drawn.blocks]
    assert planned.weight_bytes == drawn.weight_bytes


def test_a_random_mix_loads_what_was_charged_and_runs() -> None:
    loaded = load_model("random:tiny-qwen3.6@q4_k_m", devices="cpu:1x1GiB", placement="single", context=64,
                        dtype="float32")
    try:
        stage = loaded.pipeline.stages[0]
        config = loaded.config
        held = stage.model.resident_by_dtype()
        assert held == resident_by_dtype(config, RandomSource(config, fmt="q4_k_m"), "f32")
        assert {"q5_0", "q8_0"} <= held.keys()  # tiny rows: the mix's fallbacks, two packed types in one model
        assert stage.ledger.charged["weights"] == sum(held.values())
        generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=8)
        events = list(generator.stream(GenerationRequest(tuple(range(1, 12)), 4, SamplingParams(temperature=0.0),
                                                         top_logprobs=1)))
        assert len(events) == 4 and events[-1].finish_reason == "length"
        assert all(math.isfinite(e.sample.logprob) for e in events)
    finally:
        loaded.close()


def test_assess_names_a_random_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["assess", "random:tiny-llama@q4_k_m", "--devices", "1x1GiB"]) == 0
    assert "(random:tiny-llama@q4_k_m, q4_k_m," in capsys.readouterr().out
    assert main(["assess", "random:tiny-llama@q4_k_x", "--devices", "1x1GiB"]) == 2
    err = capsys.readouterr().err
    assert "q4_k_x" in err and "q4_k_m" in err and "Traceback" not in err
