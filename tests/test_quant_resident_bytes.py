"""Packed GGUF types are planned at their resident size: the file's bytes.

The loader keeps every packed type (:mod:`stagewise.spec.packed_types`) as the file's
blocks, so the planner's certificate charges a Q4_0 file about its tensor bytes (at a float32 run
dtype the dense F32 tensors are resident as stored), whether it plans from the file or from the
config with ``--format q4_0`` (llama.cpp's per-tensor types: the tiny head goes Q6_K -> Q8_0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.engine.model_loading import load_model
from stagewise.spec.charge import stage_charge
from stagewise.spec.model_source import load_model_spec
from stagewise.spec.profile import Profile
from stagewise.weights.gguf_file import GGUFFile
from stagewise.weights.gguf_spec import model_spec_from_gguf
from stagewise.weights.make_model import make_model

PRESETS = Path(__file__).resolve().parent.parent / "stagewise" / "assets" / "presets"


@pytest.mark.parametrize(("preset", "fmt"), [("tiny-qwen3-moe", "q4_0"), ("tiny-llama", "q4_0"),
                                             ("tiny-qwen3-moe", "q8_0")])
def test_planned_weights_equal_resident(tmp_path: Path, preset: str, fmt: str) -> None:
    path = make_model(preset, tmp_path / "m.gguf", "gguf", fmt, seed=7)
    from_config = load_model_spec(PRESETS / f"{preset}.json", fmt, run_dtype="f32")
    from_file = model_spec_from_gguf(path, run_dtype="f32")
    assert from_config.weight_bytes == from_file.weight_bytes
    stored = sum(info.nbytes for info in (i for _, i in GGUFFile(path).tensors.values()) if info.name != "rope_freqs.weight")
    assert abs(from_config.weight_bytes - stored) <= 0.01 * stored  # packed: the file's bytes, not 3x
    loaded = load_model(str(path), devices="cpu:2x1GiB", placement="pipeline:2", context=256, dtype="float32")
    try:
        profile = Profile(context_tokens=256, activation_dtype="f32")
        for stage in loaded.pipeline.stages:
            s = stage.spec
            resident = stage.model.resident_bytes()
            assert stage.ledger.charged["weights"] == resident
            assert s.planned_weights_bytes == resident, (s.index, s.planned_weights_bytes, resident)
            planned = stage_charge(from_config, profile, s.start, s.end, s.entry, s.exit).weights_bytes
            assert planned == resident, (s.index, planned, resident)
    finally:
        loaded.close()
