"""Packed GGUF types through the whole model, on CPU: every PACKED type stays resident as the file's
blocks, and the model's logits match transformers run on the same weights dequantized.

Models are sized so every matrix row divides into 256-value super-blocks (hidden 256), so the K-quants
are really exercised (smaller rows fall back to other types, as llama.cpp's quantizer does). A staged
run over two stages equals the single-device run bit for bit for every type.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from stagewise.models.registry import build_stage
from stagewise.models.stage_model import StageModel
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.make_model import DTYPES, load_hf_config, make_model
from stagewise.weights.stage_loader import load_stage

CPU = torch.device("cpu")
K_LLAMA: dict[str, Any] = dict(
    model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, vocab_size=320, max_position_embeddings=2048, rms_norm_eps=1e-5,
    rope_theta=500000.0, tie_word_embeddings=True,
)
K_QWEN3_MOE: dict[str, Any] = dict(
    model_type="qwen3_moe", hidden_size=256, intermediate_size=512, moe_intermediate_size=256, num_experts=4,
    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=320, max_position_embeddings=2048,
    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
)
K_QWEN36: dict[str, Any] = dict(  # value heads of 64 < 256: out_proj's column reorder becomes an input gather
    model_type="qwen3_5_moe_text", hidden_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=256,
    num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
    full_attention_interval=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4,
    linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
    vocab_size=320, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                     "mrope_interleaved": True, "mrope_section": [2, 1, 1]},
)
CASES = {"llama": K_LLAMA, "qwen3-moe": K_QWEN3_MOE, "qwen3.6": K_QWEN36}
PACKED_DTYPES = [d for d in ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                             "iq4_nl", "iq4_xs", "mxfp4") if d in DTYPES]


def _transformers_logits(raw: dict[str, Any], source: GGUFSource, prompt: torch.Tensor) -> torch.Tensor:
    import transformers

    hf_config = transformers.AutoConfig.for_model(**raw)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    state = {}
    for name in model.state_dict():
        src = "model.embed_tokens.weight" if name == "lm_head.weight" and name not in source.names() else name
        state[name] = source.load(src, CPU, torch.float32)  # dequantized by the torch reference
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        return model.eval()(prompt).logits


def _stage(source: GGUFSource, start: int, end: int) -> StageModel:
    config = source.config
    stage = build_stage(config, start, end, entry=start == 0, exit=end == config.num_layers)
    load_stage(stage, source, CPU, torch.float32)
    return stage


def _run(stages: list[StageModel], prompt: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(prompt.shape[1])[None]
    hidden: torch.Tensor = prompt
    with torch.no_grad():
        for stage in stages:
            out = stage(hidden, positions, stage.new_states(1, 64, torch.float32, CPU), start=0, all_logits=True)
            hidden = out.hidden if out.logits is None else out.logits
    return hidden


@pytest.mark.parametrize("dtype", PACKED_DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_packed_types_match_transformers_and_stay_packed(tmp_path: Path, case: str, dtype: str) -> None:
    path = make_model(CASES[case], tmp_path / "m.gguf", "gguf", dtype, seed=21)
    source = GGUFSource(path)
    single = _stage(source, 0, source.config.num_layers)
    packed = [m for m in single.modules() if getattr(m, "quantized", None)]
    assert packed, "no tensor stayed packed"
    file_bytes = sum(source.source_bytes(n) for n in source.names() if source.is_quantized(n))
    held: dict[int, int] = {}
    for m in packed:
        for q in m.quantized_weights():  # type: ignore[operator]
            held[id(q)] = q.nbytes
    assert sum(held.values()) == file_bytes  # resident = the file's bytes of every packed tensor
    prompt = torch.randint(0, source.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(3))
    got = _run([single], prompt)
    ref = _transformers_logits(load_hf_config(CASES[case]), source, prompt)
    assert float((got - ref).norm() / ref.norm()) <= 1e-5
    staged = _run([_stage(source, 0, 1), _stage(source, 1, source.config.num_layers)], prompt)
    assert torch.equal(staged, got)


def test_nan_block_scale_is_refused_naming_tensor_and_type(tmp_path: Path) -> None:
    import numpy as np
    from gguf import GGUFReader

    from stagewise.errors import CorruptModelFile

    path = make_model(K_LLAMA, tmp_path / "m.gguf", "gguf", "q4_0", seed=2)
    tensor = next(t for t in GGUFReader(path).tensors if t.name == "blk.1.ffn_down.weight")
    data = np.memmap(path, dtype=np.uint8, mode="r+", offset=int(tensor.data_offset), shape=(18 * 3,))
    data[18 * 2 : 18 * 2 + 2] = np.array([np.float16(np.nan)]).view(np.uint8)  # the third block's f16 scale
    data.flush()
    del data
    with pytest.raises(CorruptModelFile, match=r"'blk\.1\.ffn_down\.weight' \(Q4_0\) has a NaN or infinite block scale"):
        _stage(GGUFSource(path), 0, 2)
