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

from stagewise.engine.model_loading import load_model

PROMPT = 32


def _trace(loaded, steps: int = 4) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    pipe = loaded.pipeline
    pipe.reset(0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, loaded.config.vocab_size, (1, PROMPT), generator=gen)
    out = pipe.step(prompt, torch.arange(PROMPT)[None], start=0)
    logits = [out.logits.float().clone()]
    for i in range(steps):
        out = pipe.step(torch.tensor([[5 + i]]), torch.tensor([[PROMPT + i]]), start=PROMPT + i)
        logits.append(out.logits.float().clone())
    return logits


def main() -> int:
    global PROMPT
    models = sys.argv[1:]
    if models and models[0].startswith("--prompt="):
        PROMPT = int(models.pop(0).split("=")[1])
    for model in models:
        loaded = load_model(model, devices="cuda:0", placement="single", context=PROMPT + 64, dtype="bfloat16",
                            cuda_graphs=False)
        eager = _trace(loaded)
        for stage in loaded.pipeline.stages:
            stage.enable_graphs()
        graphed = _trace(loaded)
        diffs = [f"{(a - b).abs().max().item():.3g}" for a, b in zip(eager, graphed, strict=True)]
        finite = [bool(torch.isfinite(t).all()) for t in graphed]
        print(model, "eager finite:", [bool(torch.isfinite(t).all()) for t in eager], "graph finite:", finite, "max|eager-graph| per step:", diffs, flush=True)
        loaded.close()
        del loaded
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
