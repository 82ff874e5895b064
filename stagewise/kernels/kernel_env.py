"""The kernels' two environment settings, read without torch (the CLI and the API process check them
before any work): ``STAGEWISE_KERNELS`` (``triton``, the default, or ``torch``: the reference path
everywhere) and ``STAGEWISE_PDL`` (``1``, the default, or ``0``: no programmatic dependent launch).
What they select is :mod:`stagewise.kernels.triton_launch`'s."""

from __future__ import annotations

import os

from stagewise.errors import ConfigError

ENV = "STAGEWISE_KERNELS"
PDL_ENV = "STAGEWISE_PDL"


def kernels_mode() -> str:
    """``triton`` (default) or ``torch`` (the reference path everywhere), from ``STAGEWISE_KERNELS``."""
    mode = os.environ.get(ENV, "triton").strip().lower() or "triton"
    if mode not in ("triton", "torch"):
        raise ConfigError(f"{ENV}={mode!r}: expected 'triton' or 'torch'")
    return mode


def pdl_enabled() -> bool:
    """``STAGEWISE_PDL``: ``1`` (default) or ``0``."""
    value = os.environ.get(PDL_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise ConfigError(f"{PDL_ENV}={value!r}: expected '0' or '1'")
    return value != "0"
