"""The same random model as safetensors F32, GGUF F32 and GGUF Q8_0, through build_stage + load_stage.

* GGUF F32 and safetensors F32 give bit-identical logits (every converter change undone exactly);
* GGUF Q8_0 matches transformers loaded with the dequantized weights (rel err <= 1e-5, float32);
* a GGUF model split over two stages (tied embeddings loaded on both) matches one stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from stagewise.models.registry import build_stage
from stagewise.models.stage_model import StageModel
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.make_model import load_hf_config, make_model
from stagewise.weights.safetensors_source import SafetensorsSource
from stagewise.weights.stage_loader import load_stage
from stagewise.weights.tensor_source import TensorSource

CPU = torch.device("cpu")
QWEN3_NEXT: dict[str, Any] = dict(
    model_type="qwen3_next", hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, vocab_size=512, linear_conv_kernel_dim=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    partial_rotary_factor=0.25, rope_theta=10000000.0, tie_word_embeddings=False, max_position_embeddings=2048,
)
QWEN35_ODD: dict[str, Any] = dict(  # value heads of 16: out_proj's column reorder splits Q8_0 blocks -> dense
    model_type="qwen3_5_text", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    vocab_size=320, linear_conv_kernel_dim=3, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=1, linear_num_value_heads=2, tie_word_embeddings=True, max_position_embeddings=2048,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
)
CASES: dict[str, Any] = {
    "tiny-llama": "tiny-llama", "tiny-qwen3": "tiny-qwen3", "tiny-qwen3-moe": "tiny-qwen3-moe",
    "tiny-qwen3.5": "tiny-qwen3.5", "tiny-qwen3.6": "tiny-qwen3.6", "qwen3-next": QWEN3_NEXT, "qwen3.5-odd": QWEN35_ODD,
}


def _realign(stage: StageModel) -> None:
    # NOTE: CPU BLAS results can depend on a buffer's alignment (safetensors' buffers are 8-byte
    # aligned, GGUF's 32); copying both into fresh allocations compares the values, not the addresses.
    for module in stage.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(param.detach().clone(), requires_grad=False))
    stage.tie_embeddings()


def _logits(source: TensorSource, config: ModelConfig, prompt: torch.Tensor, realign: bool = False) -> torch.Tensor:
    stage = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    load_stage(stage, source, CPU, torch.float32)
    if realign:
        _realign(stage)
    states = stage.new_states(1, 64, torch.float32, CPU)
    with torch.no_grad():
        return stage(prompt, torch.arange(prompt.shape[1])[None], states, start=0, all_logits=True).logits


def _prompt(config: ModelConfig) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_f32_equals_safetensors_f32(tmp_path: Path, case: str) -> None:
    gguf_path = make_model(CASES[case], tmp_path / "m.gguf", "gguf", "f32", seed=11)
    st_dir = make_model(CASES[case], tmp_path / "st", "safetensors", "f32", seed=11)
    gguf = GGUFSource(gguf_path)
    config = ModelConfig.from_path(st_dir)
    assert gguf.config.layer_types == config.layer_types
    assert gguf.config.tie_word_embeddings == config.tie_word_embeddings
    prompt = _prompt(config)
    ref = _logits(SafetensorsSource(st_dir), config, prompt, realign=True)
    got = _logits(gguf, gguf.config, prompt, realign=True)
    assert torch.equal(got, ref)


def _transformers_model(raw: dict[str, Any], source: GGUFSource) -> torch.nn.Module:
    import transformers

    raw = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype")}
    hf_config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {}
    for name in model.state_dict():
        src = name
        if name == "lm_head.weight" and name not in source.names():
            src = "model.embed_tokens.weight"
        state[name] = source.load(src, CPU, torch.float32)  # dequantized
    model.load_state_dict(state, strict=True)
    return model.eval()


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_q8_0_matches_transformers_on_dequantized_weights(tmp_path: Path, case: str) -> None:
    path = make_model(CASES[case], tmp_path / "m.gguf", "gguf", "q8_0", seed=12)
    source = GGUFSource(path)
    assert any(source.is_quantized(n) for n in source.names())
    hf = _transformers_model(load_hf_config(CASES[case]), source)
    prompt = _prompt(source.config)
    with torch.no_grad():
        ref = hf(prompt).logits
    got = _logits(source, source.config, prompt)
    assert float((got - ref).norm() / ref.norm()) <= 1e-5


def test_two_stages_match_one_with_tied_embeddings(tmp_path: Path) -> None:
    path = make_model("tiny-qwen3", tmp_path / "m.gguf", "gguf", "q8_0", seed=13)
    source = GGUFSource(path)
    config = source.config
    assert config.tie_word_embeddings and "lm_head.weight" not in source.names()
    prompt = _prompt(config)
    single = _logits(source, config, prompt)
    first = build_stage(config, 0, 1, entry=True, exit=False)
    second = build_stage(config, 1, config.num_layers, entry=False, exit=True)
    load_stage(first, source, CPU, torch.float32)
    load_stage(second, source, CPU, torch.float32)  # reads token_embd again, for the head
    positions = torch.arange(prompt.shape[1])[None]
    with torch.no_grad():
        hidden = first(prompt, positions, first.new_states(1, 64, torch.float32, CPU), start=0).hidden
        staged = second(hidden, positions, second.new_states(1, 64, torch.float32, CPU), start=0, all_logits=True)
    assert staged.logits is not None and torch.equal(staged.logits, single)


def _rewrite_rope_freqs(path: Path, factors: list[float]) -> None:
    import numpy as np
    from gguf import GGUFReader

    tensor = next(t for t in GGUFReader(path).tensors if t.name == "rope_freqs.weight")
    data = np.memmap(path, dtype=np.float32, mode="r+", offset=int(tensor.data_offset), shape=(len(factors),))
    data[:] = np.asarray(factors, dtype=np.float32)
    data.flush()
    del data


def test_rope_freqs_factors_are_applied_as_given(tmp_path: Path) -> None:
    # llama.cpp divides each rotary inverse frequency by rope_freqs' factor, whatever the factors are;
    # factors that are not Llama 3 scaling must be used as given, not refused or re-derived
    from stagewise.models.layers.rotary import inverse_frequencies

    path = make_model("tiny-llama", tmp_path / "m.gguf", "gguf", "f32", seed=3)
    original = GGUFSource(path)
    assert original.config.rope.rope_type == "llama3"  # the converter's own factors: still llama3
    prompt = _prompt(original.config)
    before = _logits(original, original.config, prompt)
    half = original.config.rotary_dim // 2
    factors = [1.0 + 0.5 * i for i in range(half)]
    _rewrite_rope_freqs(path, factors)
    source = GGUFSource(path)
    rope = source.config.rope
    assert rope.rope_type == "factors"
    assert rope.freq_factors == tuple(float(torch.tensor(f, dtype=torch.float32)) for f in factors)
    exponents = torch.arange(0, 2 * half, 2, dtype=torch.int64).to(torch.float32) / (2 * half)
    want = (1.0 / (rope.theta**exponents)) / torch.tensor(factors, dtype=torch.float32)
    assert torch.equal(inverse_frequencies(rope, 2 * half), want)
    after = _logits(source, source.config, prompt)
    assert not torch.allclose(after, before)  # the factors changed the positions' rotation
    # a GGUF written from this config carries the same factors back
    from stagewise.weights.gguf_export import _rope_factors
    assert _rope_factors(source.config) == list(rope.freq_factors)


def test_rope_freqs_bad_factors_are_refused(tmp_path: Path) -> None:
    from stagewise.errors import StagewiseError

    path = make_model("tiny-llama", tmp_path / "m.gguf", "gguf", "f32", seed=3)
    half = GGUFSource(path).config.rotary_dim // 2
    _rewrite_rope_freqs(path, [1.0] * (half - 1) + [float("nan")])
    with pytest.raises(StagewiseError, match="rope_freqs"):
        GGUFSource(path).config  # noqa: B018
