"""model_path: what a MODEL argument names, checked without reading it (and without torch: ``serve``'s API
process asks before it listens, so a missing file fails at once, not after "listening")."""

from __future__ import annotations

from pathlib import Path

from stagewise.errors import ModelNotFound


def check_path(path: str | Path) -> Path:
    """``path`` when it names a ``.gguf`` file or a directory (what
    :func:`~stagewise.weights.open_source.open_source` opens); :class:`ModelNotFound` otherwise."""
    p = Path(path)
    if not ((p.is_file() and p.suffix == ".gguf") or p.is_dir()):
        raise ModelNotFound(f"{p}: not a .gguf file or a model directory")
    return p


def random_preset(model: str) -> tuple[str, str] | None:
    """``(PRESET, TYPE)`` of ``random:PRESET[@TYPE]`` (TYPE ``dense`` when not given); None for a path."""
    if not model.startswith("random:"):
        return None
    preset, _, fmt = model[len("random:") :].partition("@")
    return preset, fmt or "dense"


def check_model(model: str) -> None:
    """Raise what opening ``model`` would for one that is not there (an unknown ``random:`` preset, a path that
    is neither a ``.gguf`` file nor a directory); nothing is read."""
    if (random := random_preset(model)) is not None:
        from stagewise.weights.preset_configs import load_hf_config

        load_hf_config(random[0])
        return
    check_path(model)
