"""spec_from_source: a ModelSpec whose weight bytes are what a TensorSource will make resident.

Packed tensors count their packed bytes (``source.source_bytes``); everything else counts at the
run dtype, as the loader casts it. The same rule as :mod:`stagewise.weights.gguf_spec`, for any
source that keeps some tensors packed (e.g. random Q8_0 weights).
"""

from __future__ import annotations

import re

from stagewise.models.registry import build_stage
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.weights.tensor_source import TensorSource

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")


def spec_from_source(config: ModelConfig, source: TensorSource, run_dtype_bytes: int, fmt: str,
                     name: str) -> ModelSpec:
    """Exact resident bytes per block, entry and exit for ``source`` loaded at the run dtype."""
    packed_bytes = getattr(source, "source_bytes", None)
    full = build_stage(config, 0, config.num_layers, entry=True, exit=True, device="meta")
    modules = dict(full.named_modules())
    by_block = dict.fromkeys(range(config.num_layers), 0)
    entry = exit_ = 0
    for tensor in source.names():
        numel = 1
        for d in source.shape(tensor):
            numel *= d
        owner = modules.get(tensor.rpartition(".")[0])
        keeps_packed = owner is not None and hasattr(owner, "set_quantized_param")  # as the loader decides
        packed = callable(packed_bytes) and keeps_packed and source.is_quantized(tensor)
        nbytes = int(packed_bytes(tensor)) if packed and callable(packed_bytes) else numel * run_dtype_bytes
        match = _BLOCK.match(tensor)
        if match:
            by_block[int(match.group(1))] += nbytes
        elif tensor.startswith("model.embed_tokens."):
            entry += nbytes
            if config.tie_word_embeddings:
                exit_ += nbytes
        else:
            exit_ += nbytes
    return ModelSpec.from_config(config, fmt, name=name, tensor_bytes_by_block=by_block, entry_bytes=entry,
                                 exit_bytes=exit_)
