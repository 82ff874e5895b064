"""Collecting the test suite leaves Triton's mode alone, so the GPU tests run compiled kernels.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel module is imported. On a GPU machine nothing
sets it (tests/conftest.py sets it only without CUDA); if a test module (or a bench module it
imports) sets it while pytest collects, every kernel module imported after that is interpreted, and
``pytest -m gpu tests`` failed 17 compiled tests with "Did you forget to add @triton.jit". Here every
test module is imported as a GPU machine's collection would, in a fresh process without the variable:
it must stay unset and every kernel imported must be compiled-mode (a ``JITFunction``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
_COLLECT = r"""
import importlib, os, pathlib, sys
import pytest
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction
sys.path[:0] = [sys.argv[1], str(pathlib.Path(sys.argv[1], "tests"))]  # as pytest imports them
for path in sorted(pathlib.Path(sys.argv[1], "tests").glob("test_*.py")):
    if path.stem == "test_gpu_suite_isolation":
        continue
    try:
        importlib.import_module("tests." + path.stem)
    except pytest.skip.Exception:
        pass  # a module skipped whole (no GPU, no interpreter) still ran its imports up to the skip
    assert "TRITON_INTERPRET" not in os.environ, f"importing {path.name} set TRITON_INTERPRET"
interpreted = [f"{name}.{attr}" for name, module in list(sys.modules.items()) if name.startswith("stagewise.kernels")
               for attr, value in vars(module).items() if isinstance(value, InterpretedFunction)]
compiled = sum(isinstance(value, JITFunction) for name, module in list(sys.modules.items())
               if name.startswith("stagewise.kernels") for value in vars(module).values())
assert not interpreted, interpreted
assert compiled > 0
print("compiled kernels", compiled)
"""


@pytest.mark.slow
def test_collecting_every_test_module_keeps_the_kernels_compiled() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # as on a GPU machine, only without touching one
    done = subprocess.run([sys.executable, "-c", _COLLECT, str(ROOT)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled kernels" in done.stdout


def test_count_kernels_leaves_the_mode_alone_when_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import os, bench.count_kernels; assert 'TRITON_INTERPRET' not in os.environ"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
