"""Every tensor is charged at the size it is kept: the certificate's weights equal the bytes resident after
loading, per dtype, for every packed type.

A GGUF file of each packed type is loaded at bf16 on one CPU stage; the torch-free accounting
(:func:`~stagewise.weights.source_spec.resident_by_dtype`, what the planner sums) is compared kind by kind
with what the loaded stage holds (:meth:`StageModel.resident_by_dtype`, counted from its tensors):
dense parameters at the run dtype, packed blocks by type, the int64 input gathers of Qwen3.6's
permuted ``out_proj`` and the float32 rotary frequencies every stage keeps. The geometry is a small
Qwen3.6 whose rows divide into 256-value super-blocks, so K-quants stay K-quants.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stagewise.engine.model_loading import load_model
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_spec import model_spec_from_gguf
from stagewise.weights.gguf_table import GGUFTable
from stagewise.weights.make_model import make_model
from stagewise.weights.preset_configs import load_hf_config
from stagewise.weights.source_spec import resident_by_dtype, resident_spec_for_format

PACKED = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4")


def _k_quant_qwen36() -> dict[str, Any]:
    """tiny-qwen3.6 widened so every row divides into 256 values (K-quants stay K-quants)."""
    config = dict(load_hf_config("tiny-qwen3.6"))
    config.update(hidden_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=256, head_dim=64,
                  linear_key_head_dim=64, linear_value_head_dim=64, num_hidden_layers=2,
                  layer_types=["linear_attention", "full_attention"], full_attention_interval=2)
    return config


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    return {fmt: make_model(_k_quant_qwen36(), root / f"{fmt}.gguf", "gguf", fmt, seed=3) for fmt in PACKED}


@pytest.mark.parametrize("fmt", PACKED)
def test_charged_equals_resident_per_dtype(files: dict[str, Path], fmt: str) -> None:
    path = files[fmt]
    table = GGUFTable(path)
    planned = resident_by_dtype(table.config, table, "bf16")
    assert planned.get(fmt, 0) > 0  # the type itself is resident packed
    assert fmt == "q8_0" or planned["int64"] == 8 * table.config.linear_value_dim  # out_proj's input gather
    loaded = load_model(str(path), devices="cpu:1x1GiB", placement="single", context=128, dtype="bfloat16")
    try:
        stage = loaded.pipeline.stages[0]
        assert stage.model.resident_by_dtype() == planned
        charge = loaded.placement_json["stages"][0]["charge"]["weights_bytes"]
        assert charge == sum(planned.values()) == stage.spec.planned_weights_bytes == stage.ledger.charged["weights"]
        assert model_spec_from_gguf(path, run_dtype="bf16").weight_bytes == charge
    finally:
        loaded.close()


def test_format_preset_charges_the_input_gathers() -> None:
    # `assess CONFIG --format q4_k_m` charges what loading such a file holds: a linear block's packed
    # out_proj brings its int64 input gather (value_dim values), an attention block none
    from stagewise.spec.quant_presets import QuantModel, preset
    from stagewise.spec.tensor_shapes import block_tensors
    from stagewise.spec.weight_bytes import shape_bytes

    config = ModelConfig.from_hf_dict(load_hf_config("qwen3.6-35b-a3b"), source="c")
    spec = resident_spec_for_format(config, "q4_k_m", "bf16", "m")
    p, model = preset("q4_k_m"), QuantModel.from_config(config)
    for i in (0, 3):  # linear, full attention
        files = sum(shape_bytes(t, p, model, i, 2) for t in block_tensors(config, i))
        gather = 8 * config.linear_value_dim if config.block_is_linear(i) else 0
        assert spec.blocks[i].weight_bytes == files + gather
