"""OpenedModel: a MODEL argument opened — its config, tensor source and tokenizer — before any placement.

``open_model`` is the first step of every load (the coordinator's and each worker's): a Hugging Face
directory, a GGUF file or ``random:PRESET[@FORMAT]``; no weight is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from stagewise.engine.tokenizer import Tokenizer
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.model_path import random_preset
from stagewise.weights.tensor_source import TensorSource


@dataclass(frozen=True)
class OpenedModel:
    """A model's metadata and tensor source, before any placement."""

    name: str
    config: ModelConfig
    source: TensorSource
    tokenizer: Tokenizer | None
    gguf_path: Path | None = None


def open_model(model: str) -> OpenedModel:
    """Open a model path (or ``random:…``) without loading any weights."""
    if (random := random_preset(model)) is not None:  # random:PRESET[@q8_0|@q4_k|…]
        from stagewise.weights.make_model import load_hf_config
        from stagewise.weights.random_source import RandomSource

        preset, fmt = random
        raw = load_hf_config(preset)
        config = ModelConfig.from_hf_dict(raw, source=model)
        return OpenedModel(model, config, RandomSource(config, fmt=fmt), None)
    from stagewise.weights.open_source import open_source

    path = Path(model)
    source = open_source(path)
    gguf_config = getattr(source, "config", None)
    if isinstance(gguf_config, ModelConfig):  # GGUF: metadata and tokenizer live in the file
        fields = getattr(source, "fields", {})
        tokenizer = Tokenizer.from_gguf_fields(fields) if "tokenizer.ggml.tokens" in fields else None
        gguf_path = path
        return OpenedModel(path.name, gguf_config, source, tokenizer, gguf_path)
    config = ModelConfig.from_path(path)
    tokenizer = Tokenizer.from_dir(path) if (path / "tokenizer.json").exists() else None
    return OpenedModel(path.name, config, source, tokenizer)


def open_model_source(model: str) -> tuple[ModelConfig, TensorSource]:
    """A worker's opener: ``model``'s config and tensor source (it reads its own stages only)."""
    opened = open_model(model)
    return opened.config, opened.source
