"""open_source: the :class:`TensorSource` for a model path (a ``.gguf`` file or a safetensors directory)."""

from __future__ import annotations

from pathlib import Path

from stagewise.weights.model_path import check_path
from stagewise.weights.tensor_source import TensorSource


def open_source(path: str | Path) -> TensorSource:
    """``GGUFSource`` for a ``.gguf`` file (any part of a split model), ``SafetensorsSource`` for a directory.

    A directory holding exactly one GGUF model (and no safetensors) opens that GGUF.
    """
    p = check_path(path)
    if p.is_file():
        from stagewise.weights.gguf_source import GGUFSource

        return GGUFSource(p)
    if not any(p.glob("*.safetensors")):
        firsts = sorted(q for q in p.glob("*.gguf") if "-of-" not in q.name or "-00001-of-" in q.name)
        if len(firsts) == 1:
            from stagewise.weights.gguf_source import GGUFSource

            return GGUFSource(firsts[0])
    from stagewise.weights.safetensors_source import SafetensorsSource

    return SafetensorsSource(p)
