"""A stage charges every allocation to its ledger first: past its budget, StageOutOfMemory is raised
before anything is allocated, naming the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.errors import StageOutOfMemory
from stagewise.runtime.ledger import MemoryLedger
from stagewise.runtime.stage import Stage, StageSpec
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from tests.hf_models import LLAMA_CONFIGS, make_hf_model


def test_ledger_refuses_past_budget() -> None:
    ledger = MemoryLedger("cpu:1", budget_bytes=1000)
    ledger.charge("weights", 600, "weights")
    with pytest.raises(StageOutOfMemory, match="cpu:1"):
        ledger.charge("state", 500, "KV cache")
    assert ledger.total_bytes == 600  # the refused charge left no trace


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    make_hf_model("llama", LLAMA_CONFIGS["llama-gqa"], path, seed=2)
    return path


def _spec(config: ModelConfig, budget: int) -> StageSpec:
    return StageSpec(0, "cpu:0", "cpu", 0, config.num_layers, True, True, budget)


def test_weights_past_budget_raise_before_loading(model_dir: Path) -> None:
    config = ModelConfig.from_path(model_dir)
    with pytest.raises(StageOutOfMemory, match="weights"):
        Stage.load(_spec(config, 10_000), config, SafetensorsSource(model_dir), torch.float32)


def test_state_past_budget_raises_before_allocating(model_dir: Path) -> None:
    config = ModelConfig.from_path(model_dir)
    stage = Stage.load(_spec(config, 1 << 30), config, SafetensorsSource(model_dir), torch.float32)
    weights = stage.ledger.charged["weights"]
    assert weights == stage.model.resident_bytes()  # charged exactly what became resident
    stage.ledger.budget_bytes = weights + 1000  # too small for any KV cache
    with pytest.raises(StageOutOfMemory, match="state"):
        stage.allocate_state(batch=1, max_context=4096)
    assert stage.states is None and stage.ledger.charged["state"] == 0
