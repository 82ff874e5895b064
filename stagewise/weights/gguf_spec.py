"""model_spec_from_gguf: a GGUF file's :class:`ModelSpec`, from its metadata and real tensor sizes.

Resident bytes per tensor follow what the loader keeps on the device (:mod:`stagewise.weights.source_spec`):
Q8_0 matrices stay packed (34 bytes per 32 elements, as in the file); everything else is resident
dense at the run dtype (F32/F16/BF16 tensors cast to it; Q4_0 … Q6_K and Q8_0 embeddings
dequantized at load). So a Q4_K file is charged at its dense resident size, not its file size
(docs/weights.md).
"""

from __future__ import annotations

from pathlib import Path

from gguf.constants import GGMLQuantizationType

from stagewise.spec.model_spec import ModelSpec
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.source_spec import spec_from_source

_DENSE_NAMES = {GGMLQuantizationType.F32: "f32", GGMLQuantizationType.F16: "f16", GGMLQuantizationType.BF16: "bf16"}


def model_spec_from_gguf(model: str | Path | GGUFSource, run_dtype: str | None = None) -> ModelSpec:
    """Spec of a GGUF model: a path (any part of a split model) or an already open source.

    Args:
        run_dtype: dtype dense tensors are resident in (``bf16``, ``f16``, ``f32``); default: the
            file's own float type for an all-float file, else ``bf16``.
    """
    source = model if isinstance(model, GGUFSource) else GGUFSource(model)
    if run_dtype is None:
        types = {source.file.info(g).ggml_type for g in source.file.tensors}
        floats = [_DENSE_NAMES[t] for t in types if t in _DENSE_NAMES and t != GGMLQuantizationType.F32]
        run_dtype = floats[0] if types <= set(_DENSE_NAMES) and len(floats) == 1 else (
            "f32" if types == {GGMLQuantizationType.F32} else "bf16")
    return spec_from_source(source.config, source, run_dtype, Path(source.label).name)
