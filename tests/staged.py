"""Helpers to run one saved model as 1..N stages on virtual CPU devices and capture everything."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from stagewise.runtime.builder import build_pipeline
from stagewise.runtime.pipeline import Pipeline
from stagewise.runtime.stage import StageSpec
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource

BUDGET = 1 << 34


def specs_for_cuts(config: ModelConfig, cuts: list[int]) -> list[StageSpec]:
    """Stages split at block indices ``cuts`` (sorted, exclusive of 0 and num_layers)."""
    bounds = [0, *cuts, config.num_layers]
    n = len(bounds) - 1
    return [StageSpec(k, f"cpu:{k}", "cpu", bounds[k], bounds[k + 1], k == 0, k == n - 1, BUDGET)
            for k in range(n)]


def load_pipeline(path: Path, cuts: list[int], dtype: torch.dtype, context: int = 96) -> Pipeline:
    config = ModelConfig.from_path(path)
    return build_pipeline(config, SafetensorsSource(path), specs_for_cuts(config, cuts), dtype, 1, context)


@dataclass
class Trace:
    logits: list[torch.Tensor]
    features: list[torch.Tensor]
    tokens: list[int]
    states: dict[str, torch.Tensor]


def run_trace(pipeline: Pipeline, prompt: list[int], chunk: int, decode_steps: int,
              forced: list[int] | None = None) -> Trace:
    """Chunked prefill then greedy decode; every logits/features tensor and the final states. With ``forced``,
    decode step ``i`` is fed ``forced[i]`` (teacher forcing) while ``tokens`` still records each step's argmax."""
    logits, features, tokens = [], [], []
    pipeline.reset(0)
    ids = torch.tensor(prompt)[None]
    out = None
    for lo in range(0, len(prompt), chunk):
        part = ids[:, lo : lo + chunk]
        out = pipeline.step(part, torch.arange(lo, lo + part.shape[1])[None], start=lo, all_logits=True)
        logits.append(out.logits.clone())
        features.append(out.hidden.clone())
    assert out is not None
    pos = len(prompt)
    for _ in range(decode_steps):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        if forced is not None:
            token = forced[len(tokens) - 1]
        out = pipeline.step(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos)
        logits.append(out.logits.clone())
        features.append(out.hidden.clone())
        pos += 1
    states: dict[str, torch.Tensor] = {}
    for stage in pipeline.stages:
        for block, state in stage.states.items():
            for name, tensor in state.tensors().items():
                t = tensor[:, :, :pos] if name in ("key", "value") else tensor
                states[f"{block}.{name}"] = t.clone()
    return Trace(logits, features, tokens, states)


def assert_traces_equal(a: Trace, b: Trace) -> None:
    assert a.tokens == b.tokens
    assert len(a.logits) == len(b.logits)
    for x, y in zip(a.logits, b.logits, strict=False):
        assert torch.equal(x, y)
    for x, y in zip(a.features, b.features, strict=False):
        assert torch.equal(x, y)
    assert a.states.keys() == b.states.keys()
    for key in a.states:
        assert torch.equal(a.states[key], b.states[key]), key
