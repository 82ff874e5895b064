"""Qwen3-MoE, Qwen3-Next, Qwen3.5 and Qwen3.5-MoE against transformers: float32 logits over a chunked
prefill (16+16+8) and 32 greedy decode steps, plus conv / recurrent states after prefill and decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.models.recurrent_state import RecurrentState
from stagewise.models.registry import build_stage
from stagewise.models.stage_states import StageStates
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from stagewise.weights.stage_loader import load_stage
from tests.hf_hybrid_models import HYBRID_CASES, hf_linear_states, make_hf_hybrid_model

TOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _publish(states: StageStates) -> None:
    states.publish()


def _check_states(states: StageStates, cache: object, what: str) -> int:
    checked = 0
    for index, state in states.items():
        if isinstance(state, RecurrentState):
            ref = hf_linear_states(cache, index)
            for name, tensor in state.tensors().items():
                assert _rel(tensor, ref[name]) <= TOL, f"block {index} {name} state after {what}"
                checked += 1
    return checked


@pytest.mark.parametrize("name", list(HYBRID_CASES))
def test_logits_and_states_match_transformers(tmp_path: Path, name: str) -> None:
    hf = make_hf_hybrid_model(name, tmp_path, seed=3)
    config = ModelConfig.from_path(tmp_path)
    source = SafetensorsSource(tmp_path)
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, source, torch.device("cpu"), torch.float32)
    stage.fuse_projections()  # as the runtime runs them
    states = stage.new_states(1, 128, torch.float32, torch.device("cpu"))
    if name.endswith("conditional"):
        assert source.ignored() and all(n.startswith("model.visual.") for n in source.ignored())

    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, config.vocab_size, (1, 40), generator=gen)
    with torch.no_grad():
        ref_out = hf(prompt, use_cache=True)
        ours = []
        for lo in range(0, 40, 16):  # chunked prefill: 16 + 16 + 8
            chunk = prompt[:, lo : lo + 16]
            pos = torch.arange(lo, lo + chunk.shape[1])[None]
            ours.append(stage(chunk, pos, states, start=lo, all_logits=True).logits)
            _publish(states)
        got = torch.cat(ours, dim=1)
        assert _rel(got, ref_out.logits) <= TOL
        linear_blocks = _check_states(states, ref_out.cache, "prefill")
        assert linear_blocks == 2 * sum(config.block_is_linear(i) for i in range(config.num_layers))

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
            _publish(states)
            if step < 31:  # hf logits[k] scores the token after k generated tokens
                assert _rel(out.logits[:, -1], hf_out.logits[step + 1]) <= TOL
            if step == 30:  # generate's cache has seen the prompt and the first 31 generated tokens
                _check_states(states, hf_out.cache, "decode")
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        assert tokens == ref_tokens


def test_delta_rule_chunked_matches_recurrent() -> None:
    """Several 64-token chunks plus a ragged tail, from a non-zero state, against the token loop."""
    from stagewise.models.layers.delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule

    gen = torch.Generator().manual_seed(0)
    batch, steps, k_heads, v_heads, dk, dv = 2, 150, 2, 4, 8, 6
    q = torch.randn(batch, steps, k_heads, dk, generator=gen)
    k = torch.randn(batch, steps, k_heads, dk, generator=gen)
    v = torch.randn(batch, steps, v_heads, dv, generator=gen)
    g = -torch.rand(batch, steps, v_heads, generator=gen)
    beta = torch.rand(batch, steps, v_heads, generator=gen)
    state = torch.randn(batch, v_heads, dk, dv, generator=gen)
    out_c, state_c = chunked_gated_delta_rule(q, k, v, g, beta, state)
    out_r, state_r = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    assert _rel(out_c, out_r) <= TOL and _rel(state_c, state_r) <= TOL


def test_partial_batch_keeps_other_rows(tmp_path: Path) -> None:
    """A step over the first row only leaves the other row's published linear-attention state intact."""
    make_hf_hybrid_model("qwen3_5-tied-kernel3", tmp_path, seed=1)
    config = ModelConfig.from_path(tmp_path)
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, SafetensorsSource(tmp_path), torch.device("cpu"), torch.float32)
    states = stage.new_states(2, 32, torch.float32, torch.device("cpu"))
    prompt = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        stage(prompt, torch.arange(5).expand(2, 5), states, start=0)
        _publish(states)
        before = {i: {n: t[1].clone() for n, t in s.tensors().items()} for i, s in states.items()
                  if isinstance(s, RecurrentState)}
        stage(prompt[:1, :1], torch.tensor([[5]]), states, start=5)
        _publish(states)
    for i, saved in before.items():
        for n, t in saved.items():
            assert torch.equal(states[i].tensors()[n][1], t)


def test_stacked_and_per_expert_checkpoints_load_alike(tmp_path: Path) -> None:
    """A checkpoint already holding stacked ``mlp.experts.gate_up_proj`` loads like the per-expert one;
    a missing expert is a clear error."""
    from safetensors.torch import load_file, save_file

    from stagewise.errors import WeightsError

    per_expert = tmp_path / "per_expert"
    make_hf_hybrid_model("qwen3_moe-sparse", per_expert, seed=1)
    config = ModelConfig.from_path(per_expert)
    source = SafetensorsSource(per_expert)
    stacked_dir = tmp_path / "stacked"
    stacked_dir.mkdir()
    (stacked_dir / "config.json").write_text((per_expert / "config.json").read_text())
    dense = {n: source.load(n, torch.device("cpu"), torch.float32) for n in source.names()}
    assert dense["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 64, 64)
    save_file(dense, str(stacked_dir / "model.safetensors"))
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, SafetensorsSource(stacked_dir), torch.device("cpu"), torch.float32)
    for name, param in stage.named_parameters():
        assert torch.equal(param, dense[name]), name

    raw = load_file(str(per_expert / "model.safetensors"))
    del raw["model.layers.1.mlp.experts.5.up_proj.weight"]
    broken = tmp_path / "broken"
    broken.mkdir()
    save_file(raw, str(broken / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"experts\.5\.up_proj"):
        SafetensorsSource(broken)
