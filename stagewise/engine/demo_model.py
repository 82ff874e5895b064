"""The embedded demo model: a small random-weight model made deterministically and cached.

``stagewise serve`` / ``run`` / ``chat`` with no MODEL use it, split across two virtual CPU
devices, so one command on a fresh machine shows a placement and streams an answer.
"""

from __future__ import annotations

import os
from pathlib import Path

from stagewise import __version__
from stagewise.hardware.measure import cache_dir

DEMO_PRESET = "demo"
DEMO_SEED = 0
DEMO_DEVICES = "cpu:2x11.5MiB"  # the demo needs ~12.3 MB on one device, ~11.3 MB per stage on two (2 sequences)
DEMO_PLACEMENT = "auto"
DEMO_CONTEXT = 512  # a demo: short context, so weights (not attention workspace) decide the split


def ensure_demo_model() -> Path:
    """The demo model's directory, made on first use (written to a temp dir, then renamed)."""
    target = cache_dir() / f"demo-{__version__}-seed{DEMO_SEED}"
    if (target / "config.json").exists():
        return target
    from stagewise.weights.make_model import make_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    make_model(DEMO_PRESET, tmp, fmt="safetensors", dtype="f32", seed=DEMO_SEED)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race: use its copy
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target
