"""Count the kernels one decode step of each block kind launches on the GPU path.

A kernel is a non-view, non-allocating torch operation or a Triton launch. The model runs with the
Triton paths taken (through Triton's interpreter on CPU), so the count is what a CUDA device
launches by default. The cost model's per-block counts (stagewise/spec/kernel_counts.py) come from
this; re-run it after changing model code and compare:  PYTHONPATH=. python bench/count_kernels.py

Run as a script it turns Triton's interpreter on before any kernel module is imported. Imported (by
tests/test_kernel_counts.py) it changes nothing: turning the interpreter on at import, while pytest
collects, made every kernel module imported after it an interpreted one, and the compiled GPU tests
that ran later failed ("Did you forget to add @triton.jit"; tests/test_gpu_suite_isolation.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model
from stagewise.kernels.triton_launch import kernels_on_host, triton_available
from stagewise.spec.kernel_counts import block_kernels

VIEWS = {"view", "_unsafe_view", "transpose", "split", "split_with_sizes", "chunk", "expand", "select", "slice",
         "t", "unsqueeze", "squeeze", "permute", "as_strided", "detach", "alias", "unflatten", "_reshape_alias",
         "reshape", "lift_fresh", "unbind", "narrow", "flatten"}
ALLOCATIONS = {"empty", "empty_like", "new_empty", "empty_strided"}  # no kernel behind them
MODELS = ["random:tiny-llama", "random:tiny-qwen3", "random:tiny-qwen3-moe", "random:tiny-qwen3.5",
          "random:tiny-qwen3.6"]


class CountOps(TorchDispatchMode):
    """Counts every dispatched operation that is neither a view nor a bare allocation."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.paused = False  # inside a Triton launch (the interpreter's own torch calls are not kernels)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not self.paused and func.overloadpacket.__name__ not in VIEWS | ALLOCATIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_kernels() -> Iterator[CountOps]:
    """Count torch kernels and Triton launches, with the Triton paths taken on the host."""
    counter = CountOps()
    if triton_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("counting the Triton launches needs TRITON_INTERPRET=1 before the kernels are imported")
    if not triton_available():
        with counter, torch.inference_mode():
            yield counter
        return
    from triton.runtime.interpreter import InterpretedFunction

    original = InterpretedFunction.run

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter.count += 1
        counter.paused = True
        try:
            return original(self, *args, **kwargs)
        finally:
            counter.paused = False

    InterpretedFunction.run = counted  # type: ignore[method-assign]
    try:
        with kernels_on_host(), counter, torch.inference_mode():
            yield counter
    finally:
        InterpretedFunction.run = original  # type: ignore[method-assign]


def count_block(stage: Any, ctx: Any, index: int) -> int:
    """Kernels block ``index`` of ``stage`` launches for one decode step at ``ctx``; a first, uncounted
    run makes what is made once (the attention's per-head counts) and compiles the kernels."""
    hidden = torch.randn(1, 1, stage.model.config.hidden_size, dtype=torch.bfloat16)
    block = stage.model.model.layers[str(index)]
    with count_kernels():
        block(hidden, ctx, stage.states[index])
    with count_kernels() as counter:
        block(hidden, ctx, stage.states[index])
    return counter.count


def main() -> int:
    mismatches = 0
    for name in MODELS:
        loaded = load_model(name, devices="cpu:1x1GiB", context=64, dtype="bfloat16")
        stage = loaded.pipeline.stages[0]
        model = stage.model
        loaded.pipeline.reset(0)
        loaded.pipeline.step(torch.arange(1, 9)[None], torch.arange(8)[None], start=0)
        ctx = model.context(torch.tensor([[8]]), 8, torch.bfloat16, slots=stage.states.slots)
        for i in model.block_indices:
            count = count_block(stage, ctx, i)
            expected = block_kernels(model.config, i)
            mismatches += count != expected
            print(f"{name} block {i}: {count} kernels (cost model: {expected})")
        loaded.close()
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
