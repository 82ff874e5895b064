"""model_spec_from_gguf: a GGUF file's :class:`ModelSpec`, from its headers and real tensor sizes (no torch).

Resident bytes per tensor follow what the loader keeps on the device
(:mod:`stagewise.weights.source_spec`): every tensor of a packed type (Q4_0 … Q8_0, Q2_K … Q6_K,
IQ4_NL, IQ4_XS, MXFP4) that a projection, expert stack, embedding or head holds stays the file's
bytes; F32/F16/BF16 tensors and the expanded IQ types are dense at the run dtype. The spec's
``expanded`` lists what dequantizing costs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType

from stagewise.spec.model_spec import ModelSpec
from stagewise.weights.gguf_table import GGUFTable
from stagewise.weights.source_spec import source_expansions, spec_from_source

_DENSE_NAMES = {GGMLQuantizationType.F32: "f32", GGMLQuantizationType.F16: "f16", GGMLQuantizationType.BF16: "bf16"}


def model_spec_from_gguf(model: str | Path | Any, run_dtype: str | None = None) -> ModelSpec:
    """Spec of a GGUF model: a path (any part of a split model), or an open
    :class:`~stagewise.weights.gguf_table.GGUFTable` or ``GGUFSource``.

    Args:
        run_dtype: dtype dense tensors are resident in (``bf16``, ``f16``, ``f32``); default: the
            file's own float type for an all-float file, else ``bf16``.
    """
    source = GGUFTable(model) if isinstance(model, (str, Path)) else model
    if run_dtype is None:
        types = {source.file.info(g).ggml_type for g in source.file.tensors}
        floats = [_DENSE_NAMES[t] for t in types if t in _DENSE_NAMES and t != GGMLQuantizationType.F32]
        run_dtype = floats[0] if types <= set(_DENSE_NAMES) and len(floats) == 1 else (
            "f32" if types == {GGMLQuantizationType.F32} else "bf16")
    spec = spec_from_source(source.config, source, run_dtype, Path(source.label).name)
    table = source if isinstance(source, GGUFTable) else source.table  # a GGUFSource holds its table
    return replace(spec, expanded=tuple(source_expansions(table, run_dtype)))
