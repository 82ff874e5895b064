"""When the hand-written Triton kernels run, and on which device they launch.

Policy (explicit, no silent fallback inside a kernel): a layer takes its Triton path exactly when
its input lives on a CUDA device, Triton is importable and ``STAGEWISE_KERNELS`` is not ``torch``;
otherwise it runs the pure-torch reference path. Both paths of one layer compute the same
function; the Triton one fuses it into fewer launches. The choice depends only on the device
kind and the environment, so a staged run and a single-device run take the same path.

``STAGEWISE_KERNELS=torch`` forces the reference path everywhere (for A/B benchmarks and bisecting).
Tests on CPU run the kernels through Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch

ENV = "STAGEWISE_KERNELS"


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works in this process."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def kernels_mode() -> str:
    """``triton`` (default) or ``torch`` (the reference path everywhere), from ``STAGEWISE_KERNELS``."""
    mode = os.environ.get(ENV, "triton").strip().lower() or "triton"
    if mode not in ("triton", "torch"):
        raise ValueError(f"{ENV}={mode!r}: expected 'triton' or 'torch'")
    return mode


def use_triton(t: torch.Tensor) -> bool:
    """True when a layer given ``t`` should take its fused Triton path."""
    return t.device.type == "cuda" and kernels_mode() == "triton" and triton_available()


def launch_device(t: torch.Tensor) -> Any:
    """Context that makes ``t``'s device current: Triton launches on the current CUDA device,
    not on its tensors' device. A no-op off CUDA (the interpreter runs on the host)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()
