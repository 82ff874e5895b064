"""spec_from_source: a ModelSpec whose weight bytes are what the loader will make resident.

Every tensor counts as :func:`~stagewise.weights.tensor_source.resident_bytes` says — packed as
stored where the loader keeps it packed, else dense at the run dtype — so GGUF files, random Q8_0
weights and any other source with packed tensors are charged by the very rule that loads them.
"""

from __future__ import annotations

from stagewise.models.registry import build_stage
from stagewise.spec.formats import activation_bytes
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.weights.tensor_source import TensorSource, block_index, keeps_packed, resident_bytes

EMBEDDING = "model.embed_tokens.weight"


def spec_from_source(config: ModelConfig, source: TensorSource, run_dtype: str, name: str,
                     label_format: str | None = None) -> ModelSpec:
    """Exact resident bytes per block, entry and exit for ``source`` loaded at ``run_dtype``
    (``f32``/``bf16``/``f16``); the format is ``label_format`` if given, else ``q8_0`` when any
    tensor stays packed, else the run dtype."""
    dense_bytes = activation_bytes(run_dtype)
    full = build_stage(config, 0, config.num_layers, entry=True, exit=True, device="meta")
    modules = dict(full.named_modules())
    by_block = dict.fromkeys(range(config.num_layers), 0)
    entry = exit_ = 0
    any_packed = False
    for tensor in source.names():
        owner = modules.get(tensor.rpartition(".")[0])
        any_packed = any_packed or keeps_packed(owner, source, tensor)
        nbytes = resident_bytes(source, tensor, owner, dense_bytes)
        block = block_index(tensor)
        if block is not None:
            by_block[block] += nbytes
        elif tensor.startswith("model.embed_tokens."):
            entry += nbytes
        else:
            exit_ += nbytes
    if config.tie_word_embeddings and EMBEDDING in source.names():
        # the head reads the embedding, held as the head would hold it (packed when stored packed)
        exit_ += resident_bytes(source, EMBEDDING, modules["lm_head"], dense_bytes)
    fmt = label_format or ("q8_0" if any_packed else run_dtype)
    return ModelSpec.from_config(config, fmt, name=name, tensor_bytes_by_block=by_block, entry_bytes=entry,
                                 exit_bytes=exit_)


def resident_spec_for_format(config: ModelConfig, fmt: str, run_dtype: str, name: str) -> ModelSpec:
    """The spec of ``config`` stored as a ``fmt`` file and loaded at ``run_dtype``: charged what the
    loader makes resident, not what the file holds. Q8_0 matrices stay packed (the rule of a
    ``q8_0`` file and of ``random:…@q8_0``); every other quantized format (Q4_0 … Q6_K) is
    dequantized at load, so it is charged dense at the run dtype, as is a Q8_0 embedding."""
    from stagewise.weights.random_source import RandomSource

    source = RandomSource(config, fmt="q8_0" if fmt == "q8_0" else "dense")
    return spec_from_source(config, source, run_dtype, name, label_format=fmt)
