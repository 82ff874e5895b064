"""make_model: write a random-weight model of any supported architecture and geometry.

The config is a Hugging Face ``config.json`` (a path, a dict, or a preset name: see
:func:`preset_names`). Parameter names and shapes come from the model definition itself
(``build_stage`` on meta), values from :mod:`stagewise.weights.random_weights` (deterministic per
seed and tensor), the tokenizer is the small trained demo BPE with the ChatML template. The same
seed gives byte-identical files; GGUF and safetensors outputs hold the same values.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from stagewise.errors import ConfigError
from stagewise.models.registry import parameter_shapes
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.gguf_export import FILE_TYPES, write_gguf
from stagewise.weights.preset_configs import load_hf_config
from stagewise.weights.preset_configs import preset_names as preset_names  # re-exported
from stagewise.weights.random_weights import tensor_chunks
from stagewise.weights.safetensors_export import write_safetensors

FORMATS = ("gguf", "safetensors")
DENSE_DTYPES = ("f32", "f16", "bf16")  # the only ones safetensors takes
# f32 f16 bf16, then every packed GGUF type by its lower-case name: q8_0 q4_0 q4_1 q5_0 q5_1
# q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs mxfp4 (gguf_export.FILE_TYPES)
DTYPES = tuple(FILE_TYPES)
_TOKENIZER_MAX = 1024  # trained vocabulary cap (the built-in corpus runs out of merges before)
def model_params(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter the files hold: :func:`~stagewise.models.registry.parameter_shapes`."""
    return parameter_shapes(config)


def make_model(config: str | Path | dict[str, Any], out: str | Path, fmt: str = "gguf", dtype: str = "f32",
               seed: int = 0, split_max_bytes: int = 0, device: str = "cpu") -> Path:
    """Write a random model; returns the ``.gguf`` file (first part when split) or the directory.

    Args:
        config: HF config path or dict, or a preset name.
        out: a ``.gguf`` path (GGUF; other paths get ``model.gguf`` inside), or a directory (safetensors).
        fmt: ``gguf`` or ``safetensors``.
        dtype: ``f32``, ``f16``, ``bf16``, or (GGUF only) a packed type of :data:`DTYPES`: ``q8_0``,
            ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``, ``q2_k``, ``q3_k``, ``q4_k``, ``q5_k``, ``q6_k``,
            ``iq4_nl``, ``iq4_xs``, ``mxfp4``. Matrices take that type where their rows divide into its
            blocks (else llama.cpp's fallback type, else F16); norms, routers and 1-D tensors stay F32.
        seed: weights seed; equal seeds give byte-identical files.
        device: where random values are drawn and quantized (``cuda`` for large geometries; the values
            then differ from a CPU-made file of the same seed).
        split_max_bytes: GGUF split parts / safetensors shards of at most this many bytes (0: GGUF unsplit,
            safetensors 2 GB shards).
    Raises:
        ConfigError: unsupported format/dtype combination or a config the format cannot express.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r} is not supported ({', '.join(FORMATS)})")
    if dtype not in DTYPES or (fmt == "safetensors" and dtype not in DENSE_DTYPES):
        raise ConfigError(f"dtype {dtype!r} is not supported for {fmt}")
    raw = load_hf_config(config)
    model_config = ModelConfig.from_hf_dict(raw, source=str(config) if not isinstance(config, dict) else "config")
    tokenizer = _tokenizer(model_config.vocab_size)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    raw["bos_token_id"] = vocab["<|endoftext|>"]
    raw["eos_token_id"] = vocab["<|im_end|>"]
    params = model_params(model_config)

    def chunks(name: str, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        pieces = tensor_chunks(model_config, name, shape, seed, device)
        return pieces if fmt == "gguf" else (piece.cpu() for piece in pieces)

    from stagewise.weights.chatml_template import DEFAULT_CHATML
    from stagewise.weights.tokenizer_train import export_for_gguf, save_for_hf

    target = Path(out)
    if fmt == "gguf":
        if target.suffix != ".gguf":
            target.mkdir(parents=True, exist_ok=True)
            target = target / "model.gguf"
        target.parent.mkdir(parents=True, exist_ok=True)
        files = write_gguf(target, model_config, params, chunks, dtype,
                           export_for_gguf(tokenizer, chat_template=DEFAULT_CHATML,
                                           vocab_size=model_config.vocab_size), split_max_bytes)
        return files[0]
    target.mkdir(parents=True, exist_ok=True)
    raw["torch_dtype"] = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype]
    (target / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    if split_max_bytes:
        write_safetensors(target, params, chunks, dtype, split_max_bytes)
    else:
        write_safetensors(target, params, chunks, dtype)
    save_for_hf(tokenizer, target, chat_template=DEFAULT_CHATML)
    # the turn's end and the text's end both stop, as Qwen's generation_config.json says (and as llama.cpp
    # reads the GGUF form's vocabulary: stagewise.weights.end_of_generation)
    ends = {"eos_token_id": [vocab["<|im_end|>"], vocab["<|endoftext|>"]]}
    (target / "generation_config.json").write_text(json.dumps(ends, indent=2) + "\n")
    return target


def _tokenizer(vocab_size: int) -> Any:
    from stagewise.weights.tokenizer_train import TOOL_CALL_TOKENS, pad_vocab, train_demo_tokenizer

    tok = train_demo_tokenizer(min(vocab_size, _TOKENIZER_MAX) - len(TOOL_CALL_TOKENS))
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ConfigError(f"vocab_size {vocab_size} is smaller than the demo tokenizer's {size} tokens")
    return pad_vocab(tok, vocab_size)  # every embedding row named: each sampled id streams text
