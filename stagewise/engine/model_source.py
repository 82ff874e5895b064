"""Load a model for serving: :func:`stagewise.engine.model_loading.load_model` when it exists.

NOTE: interim. Until the lead's ``model_loading.load_model`` lands, :func:`load_for_serving`
loads a Hugging Face directory itself (even block split over ``pipeline:N`` stages on the
devices of ``--devices``, or one stage), without the planner's certificate. Once
``model_loading`` is importable this module only forwards to it and can be deleted.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from stagewise.engine.chat_template import ChatTemplate
from stagewise.engine.loaded_model import LoadedModel, StageProgress
from stagewise.engine.tokenizer import Tokenizer
from stagewise.errors import ConfigError, PlacementError
from stagewise.hardware.device_spec import parse_device_spec
from stagewise.hardware.sizes import format_bytes
from stagewise.runtime.builder import build_pipeline
from stagewise.runtime.stage import StageSpec
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_UNBOUNDED_BYTES = 1 << 40


def load_for_serving(model: str | None, devices: str | None, placement: str = "auto", context: int = 4096,
                     dtype: str | None = None, progress: StageProgress | None = None) -> LoadedModel:
    """``load_model`` with the same arguments; see the module note for the interim fallback."""
    try:
        module = importlib.import_module("stagewise.engine.model_loading")
    except ModuleNotFoundError as exc:
        if exc.name != "stagewise.engine.model_loading":
            raise
        return _load_directory(model, devices, placement, context, dtype, progress)
    loaded: LoadedModel = module.load_model(model, devices=devices, placement=placement, context=context,
                                            dtype=dtype, progress=progress)
    return loaded


def _stage_count(placement: str) -> int:
    if placement in ("auto", "single"):
        return 1
    kind, _, count = placement.partition(":")
    if kind != "pipeline" or not count.isdigit() or int(count) < 1:
        raise PlacementError(f"--placement must be auto, single or pipeline:N, got {placement!r}")
    return int(count)


def _load_directory(model: str | None, devices: str | None, placement: str, context: int,
                    dtype: str | None, progress: StageProgress | None) -> LoadedModel:
    if model is None:
        raise ConfigError("the embedded demo model needs stagewise.engine.model_loading; pass a model directory")
    path = Path(model)
    config = ModelConfig.from_path(path)
    n = _stage_count(placement)
    if n > config.num_layers:
        raise PlacementError(f"pipeline:{n} needs at least {n} blocks; the model has {config.num_layers}")
    found = parse_device_spec(devices) if devices else ()
    ids = [d.id for d in found] or ["cpu:0"]
    budgets = [d.budget_bytes or _UNBOUNDED_BYTES for d in found] or [_UNBOUNDED_BYTES]
    torch_devices = [d.torch_device or "cpu" for d in found] or ["cpu"]
    if len(ids) < n:
        raise PlacementError(f"pipeline:{n} needs {n} devices; --devices gives {len(ids)}")
    bounds = [config.num_layers * k // n for k in range(n + 1)]
    specs = [StageSpec(k, ids[k], torch_devices[k], bounds[k], bounds[k + 1], k == 0, k == n - 1, budgets[k])
             for k in range(n)]
    torch_dtype = _DTYPES.get(dtype or "float32")
    if torch_dtype is None:
        raise ConfigError(f"--dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    pipeline = build_pipeline(config, SafetensorsSource(path), specs, torch_dtype, 1, context, progress=progress)
    tokenizer = Tokenizer.from_dir(path)
    parts = []
    for spec, stage in zip(specs, pipeline.stages, strict=True):
        what = [*(["embedding"] if spec.entry else []), f"blocks {spec.start}-{spec.end - 1}",
                *(["head"] if spec.exit else [])]
        parts.append(f"{spec.device} {' + '.join(what)} ({format_bytes(stage.ledger.total_bytes)})")
    summary = f"Fits across {n} device{'s' if n > 1 else ''}: " + " · ".join(parts)
    return LoadedModel(
        name=path.name, config=config, pipeline=pipeline,
        placement_json={"stages": [{"device": s.device, "start": s.start, "end": s.end} for s in specs]},
        placement_summary=summary, tokenizer=tokenizer, chat_template=ChatTemplate(tokenizer.chat_template),
        max_context=context, dtype=torch_dtype,
    )
