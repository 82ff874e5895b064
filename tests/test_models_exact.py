"""Llama and Qwen3 against transformers: float32 logits over a chunked prefill and 32 decode steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.models.registry import build_stage
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from stagewise.weights.stage_loader import load_stage
from tests.hf_models import LLAMA_CONFIGS, QWEN3_CONFIGS, make_hf_model

CASES = [("llama", k) for k in LLAMA_CONFIGS] + [("qwen3", k) for k in QWEN3_CONFIGS]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(("family", "name"), CASES)
def test_logits_match_transformers(tmp_path: Path, family: str, name: str) -> None:
    overrides = {**LLAMA_CONFIGS, **QWEN3_CONFIGS}[name]
    hf = make_hf_model(family, overrides, tmp_path, seed=3)
    config = ModelConfig.from_path(tmp_path)
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, SafetensorsSource(tmp_path), torch.device("cpu"), torch.float32)
    stage.fuse_projections()  # q/k/v and gate/up as single matmuls, as the runtime runs them
    states = stage.new_states(1, 128, torch.float32, torch.device("cpu"))

    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, config.vocab_size, (1, 40), generator=gen)
    with torch.no_grad():
        ref = hf(prompt).logits  # (1, 40, V)
        ours = []
        for lo in range(0, 40, 16):  # chunked prefill: 16 + 16 + 8
            chunk = prompt[:, lo : lo + 16]
            pos = torch.arange(lo, lo + chunk.shape[1])[None]
            ours.append(stage(chunk, pos, states, start=lo, all_logits=True).logits)
        got = torch.cat(ours, dim=1)
        assert _rel(got, ref) <= 1e-5

        # 32 greedy decode steps, compared step by step with transformers' generate
        hf.generation_config.eos_token_id = None  # generate all 32 tokens
        hf_out = hf.generate(prompt, max_new_tokens=32, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        ref_tokens = hf_out.sequences[0, 40:].tolist()
        token = got[:, -1].argmax(-1, keepdim=True)  # (1, 1)
        tokens = []
        for step in range(32):
            tokens.append(int(token))
            out = stage(token, torch.tensor([[40 + step]]), states, start=40 + step)
            if step < 31:  # hf logits[k] scores the token after k generated tokens
                assert _rel(out.logits[:, -1], hf_out.logits[step + 1]) <= 1e-5
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        assert tokens == ref_tokens
