"""Test-session setup: without a GPU, Triton kernels run through Triton's interpreter on the host."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: must precede the first import of a kernel module (@triton.jit reads it at decoration)
    os.environ.setdefault("TRITON_INTERPRET", "1")
