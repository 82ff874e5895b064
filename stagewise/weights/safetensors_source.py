"""SafetensorsSource: a Hugging Face model directory's ``*.safetensors`` (sharded index allowed)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from stagewise.errors import CorruptModelFile, ModelNotFound, UnsupportedTensorType, WeightsError
from stagewise.models.layers.quantized_weight import QuantizedWeight
from stagewise.weights.expert_stacking import StackedTensor, load_stacked, plan_expert_stacking

_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.", "model.mtp.")


def _strip_prefix(name: str) -> str:
    """Multimodal checkpoints nest the text model: ``model.language_model.X`` -> ``model.X``."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return name


class _ShardReader:
    """Reads tensors by our name, opening each shard at most once while in use."""

    def __init__(self, where: dict[str, tuple[Path, str]]) -> None:
        self.where = where
        self.handles: dict[Path, Any] = {}
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> _ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def __call__(self, name: str) -> torch.Tensor:
        path, raw = self.where[name]
        try:
            handle = self.handles.get(path)
            if handle is None:
                handle = self.stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
                self.handles[path] = handle
            tensor: torch.Tensor = handle.get_tensor(raw)
        except SafetensorError as exc:
            raise CorruptModelFile(f"{path}: cannot read tensor {raw!r} ({exc})") from None
        return tensor


class SafetensorsSource:
    """Reads tensors lazily, each one straight to its device."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise ModelNotFound(f"{self.directory}: not a directory")
        files = sorted(self.directory.glob("*.safetensors"))
        if not files:
            raise ModelNotFound(f"{self.directory}: no *.safetensors files")
        self._where: dict[str, tuple[Path, str]] = {}
        self._ignored: set[str] = set()
        self._shapes: dict[str, tuple[int, ...]] = {}
        for path in files:
            try:
                with safe_open(str(path), framework="pt") as handle:
                    for raw in handle.keys():  # safe_open has no __iter__
                        name = _strip_prefix(raw)
                        if name.startswith(_IGNORED_PREFIXES):
                            self._ignored.add(raw)
                            continue
                        if name in self._where:
                            raise WeightsError(f"{path.name}: duplicate tensor {raw!r} (also in {self._where[name][0].name})")
                        self._where[name] = (path, raw)
                        tensor = handle.get_slice(raw)
                        if tensor.get_dtype() not in _FLOAT_DTYPES:
                            raise UnsupportedTensorType(
                                f"{path}: tensor {raw!r} has dtype {tensor.get_dtype()} (weights are {', '.join(_FLOAT_DTYPES)})"
                            )
                        self._shapes[name] = tuple(tensor.get_shape())
            except SafetensorError as exc:
                raise CorruptModelFile(f"{path}: not a valid safetensors file ({exc})") from None
        self._check_index(files)
        # per-expert MoE matrices are presented as the model's stacked 3-D expert weights
        self._stacked: dict[str, StackedTensor] = plan_expert_stacking(self._shapes, self.label)
        for stacked in self._stacked.values():
            for part in (p for parts in stacked.parts for p in parts):
                del self._shapes[part]
            if stacked.name in self._shapes:
                raise WeightsError(f"{self.label}: tensor {stacked.name!r} is stored both stacked and per expert")
            self._shapes[stacked.name] = stacked.shape

    def _check_index(self, files: list[Path]) -> None:
        index = self.directory / "model.safetensors.index.json"
        if not index.exists():
            return
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (KeyError, ValueError) as exc:
            raise CorruptModelFile(f"{index}: bad index ({exc})") from None
        present = {p.name for p in files}
        missing = sorted({f for f in weight_map.values() if f not in present})
        if missing:
            raise WeightsError(f"{index}: shard {missing[0]} listed in the index is missing")

    @property
    def label(self) -> str:
        return str(self.directory)

    def names(self) -> set[str]:
        return set(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def is_quantized(self, name: str) -> bool:
        return False

    def load(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        # each shard is opened (its header parsed) once per loaded tensor, however many source
        # matrices a stacked expert tensor gathers from it
        with _ShardReader(self._where) as read:
            stacked = self._stacked.get(name)
            if stacked is not None:
                return load_stacked(stacked, read, device, dtype)
            return read(name).to(device=device, dtype=dtype)

    def load_quantized(self, name: str, device: torch.device) -> QuantizedWeight:
        raise WeightsError(f"{self.label}: tensor {name!r} is not quantized")

    def ignored(self) -> set[str]:
        return set(self._ignored)
