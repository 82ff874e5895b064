"""Planned vs measured charge per stage: within 5 %, never under the measurement by more than 1 %."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagewise.engine.model_loading import load_model
from tests.hf_hybrid_models import make_hf_hybrid_model
from tests.hf_models import LLAMA_CONFIGS, QWEN3_CONFIGS, make_hf_model

CASES = ["llama", "qwen3", "qwen3_moe-sparse", "qwen3_next-default-pattern", "qwen3_5-tied-kernel3",
         "qwen3_5_moe-text"]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_planned_matches_measured(tmp_path: Path, name: str, dtype: str) -> None:
    if name == "llama":
        make_hf_model("llama", LLAMA_CONFIGS["llama3-rope-tied"] | {"num_hidden_layers": 4}, tmp_path)
    elif name == "qwen3":
        make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-gqa"], tmp_path)
    else:
        make_hf_hybrid_model(name, tmp_path)
    loaded = load_model(str(tmp_path), devices="cpu:2x1GiB", placement="pipeline:2", context=512, dtype=dtype)
    try:
        checks = loaded.charge_checks()
        assert len(checks) == 2
        for check in checks:
            assert check.measured_bytes > 0
            assert 0.99 <= check.ratio <= 1.05, (name, check)
    finally:
        loaded.close()
