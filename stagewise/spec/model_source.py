"""Find a model on disk and turn it into a ModelSpec: GGUF file, model directory, config.json.

* ``*.gguf``: ``stagewise.weights.gguf_spec.model_spec_from_gguf(path)`` (imported lazily).
* a directory with ``config.json``: format from the safetensors header's dtype, else the
  config's ``torch_dtype`` / ``dtype``, else ``bf16``; ``fmt`` overrides.
* a bare ``*.json`` config: ``fmt`` (default ``bf16``).
* a quantized ``fmt`` (a preset of :mod:`stagewise.spec.quant_presets`: ``q4_k_m``, ``q8_0`` …)
  with a ``run_dtype``: charged what the loader makes resident of the file llama.cpp's quantizer
  writes (:func:`stagewise.weights.source_spec.resident_spec_for_format`): packed tensors their
  file bytes, the rest (expanded IQ types too) dense at the run dtype.
A directory without ``config.json`` is a catalog: :func:`catalog_entries` lists its models.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from stagewise.errors import ConfigError, ModelNotFound
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.quant_presets import preset

_SAFETENSORS_DTYPES = {"BF16": "bf16", "F16": "f16", "F32": "f32"}


def is_catalog(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and not (p / "config.json").exists()


def load_model_spec(path: str | Path, fmt: str | None = None, run_dtype: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of the model at ``path`` (see module docstring).

    ``run_dtype`` (``f32``/``bf16``/``f16``): the dtype the runtime keeps dense weights in; a model
    directory without ``fmt`` is charged at it (the loader casts to it), a GGUF's dense tensors too.
    """
    p = Path(path)
    if not p.exists():
        raise ModelNotFound(f"{p}: no such file or directory")
    if p.suffix == ".gguf":
        return _from_gguf(p, run_dtype)
    config = ModelConfig.from_path(p)
    name = p.name if p.is_dir() else p.stem
    if fmt is None and p.is_dir() and run_dtype is not None:
        fmt = run_dtype  # the loader casts dense checkpoints to the run dtype
    if fmt is None:
        fmt = _dir_format(p) if p.is_dir() else None
        fmt = fmt or _config_dtype(p / "config.json" if p.is_dir() else p) or "bf16"
    if run_dtype is not None and preset(fmt).quantized:
        from stagewise.weights.source_spec import resident_spec_for_format

        return resident_spec_for_format(config, preset(fmt).name, run_dtype, name)
    return ModelSpec.from_config(config, fmt, name=name)


def catalog_entries(path: str | Path) -> list[Path]:
    """Models in a catalog directory: subdirectories with config.json, *.gguf and *.json files."""
    p = Path(path)
    out = []
    for child in sorted(p.iterdir()):
        if child.is_dir() and (child / "config.json").exists():
            out.append(child)
        elif child.is_file() and child.suffix in (".gguf", ".json"):
            out.append(child)
    if not out:
        raise ModelNotFound(f"{p}: no models (subdirectories with config.json, *.gguf or *.json)")
    return out


def _from_gguf(p: Path, run_dtype: str | None = None) -> ModelSpec:
    try:
        from stagewise.weights.gguf_spec import model_spec_from_gguf  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(f"{p}: GGUF assessment is unavailable (stagewise.weights.gguf_spec is not installed)") from None
    spec = model_spec_from_gguf(p, run_dtype=run_dtype)
    if not isinstance(spec, ModelSpec):
        raise ConfigError(f"{p}: the GGUF reader did not return a ModelSpec")
    return spec


def _dir_format(p: Path) -> str | None:
    for st in sorted(p.glob("*.safetensors")):
        try:
            with st.open("rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                if length > 100_000_000:
                    continue
                header: dict[str, Any] = json.loads(fh.read(length))
        except (OSError, struct.error, ValueError, RecursionError):
            continue
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict):
                dtype = _SAFETENSORS_DTYPES.get(str(info.get("dtype")))
                if dtype:
                    return dtype
    return None


def _config_dtype(p: Path) -> str | None:
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError, RecursionError):  # ValueError: bad JSON or UTF-8; read and refused later
        return None
    if not isinstance(raw, dict):
        return None
    candidates = [raw.get("torch_dtype"), raw.get("dtype")]
    text = raw.get("text_config")
    if isinstance(text, dict):
        candidates += [text.get("torch_dtype"), text.get("dtype")]
    for value in candidates:
        if isinstance(value, str) and value.lower() in ("bfloat16", "float16", "float32", "bf16", "f16", "f32"):
            return {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(value.lower(), value.lower())
    return None
