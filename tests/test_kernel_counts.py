"""The cost model's kernels per decode step match what the model code launches on the GPU path."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")  # the counts are of the GPU path, whose fused kernels need Triton
if os.environ.get("TRITON_INTERPRET") != "1":
    # NOTE: the launches are counted through Triton's interpreter (CPU runs: tests/conftest.py). With a GPU the
    # kernels are compiled, and turning the interpreter on here would leak into every later test
    pytest.skip("kernel counts run through Triton's interpreter (TRITON_INTERPRET=1)", allow_module_level=True)

from bench.count_kernels import count_block
from stagewise.engine.model_loading import load_model
from stagewise.spec.kernel_counts import block_kernels


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-qwen3", "random:tiny-qwen3-moe",
                                   "random:tiny-qwen3.5", "random:tiny-qwen3.6"])
def test_block_kernel_counts(model: str) -> None:
    loaded = load_model(model, devices="cpu:1x1GiB", context=64, dtype="bfloat16")
    stage = loaded.pipeline.stages[0]
    loaded.pipeline.reset(0)
    loaded.pipeline.step(torch.arange(1, 9)[None], torch.arange(8)[None], start=0)
    ctx = stage.model.context(torch.tensor([[8]]), 8, torch.bfloat16, slots=stage.states.slots)
    for i in stage.model.block_indices:
        assert count_block(stage, ctx, i) == block_kernels(stage.model.config, i), (model, i)
