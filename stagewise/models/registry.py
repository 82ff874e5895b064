"""Architecture family -> block factory; :func:`build_stage` builds any family's stage."""

from __future__ import annotations

import importlib

import torch

from stagewise.errors import UnsupportedArchitecture
from stagewise.models.stage_model import BlockFactory, StageModel
from stagewise.spec.model_config import ModelConfig

# family -> "module:function" (imported lazily so a family's module loads only when used)
_FACTORIES: dict[str, str] = {
    "llama": "stagewise.models.llama:llama_block",
    "qwen3": "stagewise.models.llama:qwen3_block",
    "qwen3_moe": "stagewise.models.qwen3_moe:qwen3_moe_block",
    "qwen3_next": "stagewise.models.hybrid:hybrid_block",
    "qwen3_5": "stagewise.models.hybrid:hybrid_block",
    "qwen3_5_moe": "stagewise.models.hybrid:hybrid_block",
}


def block_factory(architecture: str) -> BlockFactory:
    target = _FACTORIES.get(architecture)
    if target is None:
        raise UnsupportedArchitecture(f"architecture {architecture!r} has no model definition")
    module_name, func = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        raise UnsupportedArchitecture(f"architecture {architecture!r} is not implemented yet") from None
    factory: BlockFactory = getattr(module, func)
    return factory


def build_stage(config: ModelConfig, start: int, end: int, entry: bool, exit: bool,
                device: torch.device | str = "meta") -> StageModel:
    """Build the stage's modules on ``device`` (``meta`` by default: no memory until weights load)."""
    factory = block_factory(config.architecture)
    with torch.device(device):
        return StageModel(config, start, end, entry, exit, factory)


def parameter_shapes(config: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of the whole model, in model order, built on meta (no
    memory); the LM head is omitted when tied (it reads the embedding)."""
    model = build_stage(config, 0, config.num_layers, entry=True, exit=True)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters(remove_duplicate=False)]
    if config.tie_word_embeddings:
        params = [(n, s) for n, s in params if n != "lm_head.weight"]
    return params
