"""model_spec_from_gguf: a GGUF file's :class:`ModelSpec`, from its metadata and real tensor sizes.

Resident bytes per tensor follow what the loader keeps on the device: Q8_0 matrices stay packed
(34 bytes per 32 elements, as in the file); everything else is resident dense at the run dtype
(F32/F16/BF16 tensors cast to it; Q4_0 … Q6_K and Q8_0 embeddings dequantized at load). So a
Q4_K file is charged at its dense resident size, not its file size (docs/weights.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from gguf.constants import GGMLQuantizationType

from stagewise.spec.formats import activation_bytes
from stagewise.spec.model_spec import ModelSpec
from stagewise.weights.gguf_source import GGUFSource

_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")
_DENSE_NAMES = {GGMLQuantizationType.F32: "f32", GGMLQuantizationType.F16: "f16", GGMLQuantizationType.BF16: "bf16"}


def model_spec_from_gguf(path: str | Path, run_dtype: str | None = None) -> ModelSpec:
    """Spec of the GGUF model at ``path`` (any part of a split model).

    Args:
        run_dtype: dtype dense tensors are resident in (``bf16``, ``f16``, ``f32``); default: the
            file's own float type for an all-float file, else ``bf16``.
    """
    source = GGUFSource(path)
    config = source.config
    types = {source.file.info(g).ggml_type for g in source.file.tensors}
    resident_q8 = {n for n in source.names() if source.is_quantized(n) and n != "model.embed_tokens.weight"}
    if run_dtype is None:
        floats = [_DENSE_NAMES[t] for t in types if t in _DENSE_NAMES and t != GGMLQuantizationType.F32]
        run_dtype = floats[0] if types <= set(_DENSE_NAMES) and len(floats) == 1 else (
            "f32" if types == {GGMLQuantizationType.F32} else "bf16")
    dense_bytes = activation_bytes(run_dtype)
    by_block: dict[int, int] = {i: 0 for i in range(config.num_layers)}
    entry = exit_ = 0
    for name in source.names():
        shape = source.shape(name)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = source.source_bytes(name) if name in resident_q8 else numel * dense_bytes
        match = _BLOCK.match(name)
        if match:
            by_block[int(match.group(1))] += nbytes
        elif name.startswith("model.embed_tokens."):
            entry += nbytes
            if config.tie_word_embeddings:  # the head reads the embedding (packed when Q8_0)
                exit_ += source.source_bytes(name) if source.is_quantized(name) else nbytes
        else:
            exit_ += nbytes
    fmt = "q8_0" if resident_q8 else run_dtype
    return ModelSpec.from_config(config, fmt, name=Path(path).name, tensor_bytes_by_block=by_block,
                                 entry_bytes=entry, exit_bytes=exit_)
