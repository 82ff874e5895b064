"""Test-session setup: without a GPU, Triton kernels run through Triton's interpreter on the host; worker
processes use this process's CPU thread count."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # NOTE: must precede the first import of a kernel module (@triton.jit reads it at decoration)
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.interpreter_calls import install

    install()  # device-function calls without re-patching the language each time (tests/interpreter_calls.py)

# worker processes compute with this process's thread count: CPU float results can depend on it, and the
# multiprocess tests compare workers with this process bit for bit (a local worker otherwise takes its
# share of the cores: runtime/worker_pool.py)
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))

_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


def pytest_collection_finish(session: object) -> None:
    """Refuse a run whose collection changed Triton's mode: kernel modules imported after the change
    would run interpreted (on a GPU: "Did you forget to add @triton.jit"; tests/test_gpu_suite_isolation.py)."""
    import pytest

    if os.environ.get("TRITON_INTERPRET") != _INTERPRET_AT_START:
        raise pytest.UsageError(f"collecting the tests changed TRITON_INTERPRET from {_INTERPRET_AT_START!r} to "
                                f"{os.environ.get('TRITON_INTERPRET')!r}: set it in tests/conftest.py only")
