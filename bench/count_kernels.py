"""Count the kernels (non-view operations) one decode step of each block kind launches.

The cost model's per-block kernel counts (stagewise/spec/kernel_counts.py) come from this; re-run
it after changing model code and compare:  PYTHONPATH=. python bench/count_kernels.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model
from stagewise.spec.kernel_counts import block_kernels

VIEWS = {"view", "_unsafe_view", "transpose", "split", "split_with_sizes", "chunk", "expand", "select", "slice",
         "t", "unsqueeze", "squeeze", "permute", "as_strided", "detach", "alias", "unflatten", "_reshape_alias",
         "reshape", "lift_fresh", "unbind", "narrow"}
MODELS = ["random:tiny-llama", "random:tiny-qwen3", "random:tiny-qwen3-moe", "random:tiny-qwen3.5",
          "random:tiny-qwen3.6"]


class CountOps(TorchDispatchMode):
    """Counts every dispatched operation that is not a view."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.overloadpacket.__name__ not in VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def main() -> int:
    mismatches = 0
    for name in MODELS:
        loaded = load_model(name, devices="cpu:1x1GiB", context=64, dtype="bfloat16")
        stage = loaded.pipeline.stages[0]
        model = stage.model
        loaded.pipeline.reset(0)
        loaded.pipeline.step(torch.arange(1, 9)[None], torch.arange(8)[None], start=0)
        ctx = model.context(torch.tensor([[8]]), 8, torch.bfloat16)
        for i in model.block_indices:
            hidden = torch.randn(1, 1, model.config.hidden_size, dtype=torch.bfloat16)
            counter = CountOps()
            with counter, torch.inference_mode():
                model.model.layers[str(i)](hidden, ctx, stage.states[i])
            expected = block_kernels(model.config, i)
            mismatches += counter.count != expected
            print(f"{name} block {i}: {counter.count} kernels (cost model: {expected})")
        loaded.close()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
