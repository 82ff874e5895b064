"""Staged execution on virtual CPU devices is bit-identical to one device (torch.equal)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.hf_models import LLAMA_CONFIGS, QWEN3_CONFIGS, make_hf_model
from tests.staged import assert_traces_equal, load_pipeline, run_trace

MODELS = {"llama": LLAMA_CONFIGS["llama-gqa"] | {"num_hidden_layers": 5},
          "qwen3": QWEN3_CONFIGS["qwen3-gqa"] | {"num_hidden_layers": 5, "tie_word_embeddings": True}}
CUTS = [[1], [4], [2], [1, 3], [2, 4], [1, 2, 4], [0], [5], [0, 5]]  # incl. empty stages next to entry/exit
PROMPT = [(i * 37 + 11) % 150 for i in range(40)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for family, overrides in MODELS.items():
        path = tmp_path_factory.mktemp(family)
        make_hf_model(family, overrides, path, seed=5)
        out[family] = path
    return out


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_equals_single(saved: dict[str, Path], family: str, dtype: torch.dtype) -> None:
    single = run_trace(load_pipeline(saved[family], [], dtype), PROMPT, chunk=16, decode_steps=32)
    for cuts in CUTS:
        staged = run_trace(load_pipeline(saved[family], cuts, dtype), PROMPT, chunk=16, decode_steps=32)
        assert_traces_equal(single, staged)
