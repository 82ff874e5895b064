"""Probe: does a decode step replayed from a CUDA graph give what the eager step gives?

For each model: one eager pass (prefill + decode steps), then the same with CUDA graphs; prints
whether logits are finite and the largest difference per decode step.

    python bench/graph_probe.py random:llama-3.1-8b@q8_0 random:qwen3-30b-a3b random:qwen3-30b-a3b@q8_0
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model  # noqa: E402


def _trace(loaded, steps: int = 4) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    pipe = loaded.pipeline
    pipe.reset(0)
    out = pipe.step(torch.arange(1, 33)[None], torch.arange(32)[None], start=0)
    logits = [out.logits.float().clone()]
    for i in range(steps):
        out = pipe.step(torch.tensor([[5 + i]]), torch.tensor([[32 + i]]), start=32 + i)
        logits.append(out.logits.float().clone())
    return logits


def main() -> int:
    for model in sys.argv[1:]:
        loaded = load_model(model, devices="cuda:0", placement="single", context=256, dtype="bfloat16",
                            cuda_graphs=False)
        eager = _trace(loaded)
        for stage in loaded.pipeline.stages:
            stage.enable_graphs()
        graphed = _trace(loaded)
        diffs = [f"{(a - b).abs().max().item():.3g}" for a, b in zip(eager, graphed, strict=True)]
        finite = [bool(torch.isfinite(t).all()) for t in graphed]
        print(model, "graph finite:", finite, "max|eager-graph| per step:", diffs, flush=True)
        loaded.close()
        del loaded
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
