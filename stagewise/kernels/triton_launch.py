"""When the hand-written Triton kernels run, and on which device they launch.

Policy (explicit, no silent fallback inside a kernel): a layer takes its Triton path exactly when
its input lives on a CUDA device, Triton is importable and ``STAGEWISE_KERNELS`` is not ``torch``;
otherwise it runs the pure-torch reference path. Both paths of one layer compute the same
function; the Triton one fuses it into fewer launches. The choice depends only on the device
kind and the environment, so a staged run and a single-device run take the same path.

``STAGEWISE_KERNELS=torch`` forces the reference path everywhere (for A/B benchmarks and bisecting).
Tests on CPU run the kernels through Triton's interpreter (``TRITON_INTERPRET=1``).

Programmatic dependent launch (Hopper and later, a Triton that knows ``launch_pdl``): the decode
chain's kernels are launched so that the next one may start while its predecessor's last programs
run. The contract every such kernel keeps (:func:`dependent_launch`): it waits for the previous
kernel (``grid_dependency.wait_for_predecessor``) before any load of data another kernel writes and
before any store (only weights, which nothing writes, may be read before), and it waits in every
program, so the wait is transitive along the stream; then it lets its own successor launch.
Results are unchanged, only the gaps between kernels shrink. ``STAGEWISE_PDL=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import torch

from stagewise.kernels.kernel_env import ENV, PDL_ENV, kernels_mode, pdl_enabled

__all__ = ["ENV", "PDL_ENV", "capturing", "cdiv", "dependent_launch", "hopper_or_later", "int32_index", "kernels_mode", "kernels_on_host",
           "launch_device", "next_power_of_2", "pdl_enabled", "triton_available", "triton_selected",
           "use_triton"]
_on_host = False  # tests: take the Triton path on CPU tensors too (run by Triton's interpreter)


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` works in this process."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """True when a layer given ``t`` should take its fused Triton path."""
    on_device = t.is_cuda or (_on_host and os.environ.get("TRITON_INTERPRET") == "1")
    return on_device and triton_selected()


def triton_selected() -> bool:
    """Whether the Triton paths are chosen wherever a device can run them: Triton is importable and
    ``STAGEWISE_KERNELS`` is not ``torch`` (:func:`use_triton` adds the tensor's device)."""
    return kernels_mode() == "triton" and triton_available()


@contextlib.contextmanager
def kernels_on_host() -> Iterator[None]:
    """Tests: inside this block, CPU tensors take the Triton paths too, through the interpreter
    (only when ``TRITON_INTERPRET=1`` was set before the kernels were imported)."""
    global _on_host
    previous, _on_host = _on_host, True
    try:
        yield
    finally:
        _on_host = previous


_NO_SWITCH = contextlib.nullcontext()


def capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (then nothing launched runs
    until a replay: a buffer made and zeroed now holds no values before the graph's first replay)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def launch_device(t: torch.Tensor) -> Any:
    """Context that makes ``t``'s device current: Triton launches on the current CUDA device,
    not on its tensors' device. A no-op off CUDA (the interpreter runs on the host) and where that
    device is already current (a stage's step runs on its device: no switch, a few us per launch)."""
    if t.device.type != "cuda" or t.device.index is None or t.device.index == torch.cuda.current_device():
        return _NO_SWITCH
    return torch.cuda.device(t.device)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids and tile counts on the host.

    NOTE: Triton's ``triton.cdiv`` / ``triton.next_power_of_2`` are constexpr functions now, whose host
    calls unwrap every argument through a Python wrapper (several us each, dozens a layer)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``), on the host (see :func:`cdiv`)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def int32_index(index: torch.Tensor) -> torch.Tensor:
    """``index`` as a contiguous int32 tensor, without a copy when it already is one (kernels index with int32)."""
    return index if index.dtype == torch.int32 and index.is_contiguous() else index.to(torch.int32).contiguous()


@functools.cache
def _triton_launches_pdl() -> bool:
    """Whether this Triton's CUDA backend takes the ``launch_pdl`` launch option."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def hopper_or_later(device: torch.device) -> bool:
    """Whether CUDA ``device`` is Hopper or later (dependent launch, the tensor memory accelerator);
    asked of the driver once per device."""
    return _hopper_or_later(device.index if device.index is not None else torch.cuda.current_device())


_ORDINARY: dict[str, Any] = {"GDC": False}


def dependent_launch(t: torch.Tensor) -> dict[str, Any]:
    """Launch options (to unpack into the launch; never to modify) for a kernel that keeps the
    dependent-launch contract (module note), on ``t``'s device: ``GDC`` (the kernel's constexpr: wait,
    then release the successor) and ``launch_pdl`` where the device, Triton and ``STAGEWISE_PDL`` allow
    it; ``GDC=False`` otherwise (the interpreter, older GPUs), which launches exactly as before.
    Decided once per process and device (``STAGEWISE_PDL`` read at the first launch): asked at every launch."""
    if not t.is_cuda:
        return _ORDINARY
    return _device_launch(t.get_device())


@functools.cache
def _device_launch(index: int) -> dict[str, Any]:
    if not pdl_enabled() or not _triton_launches_pdl() or not _hopper_or_later(index):
        return _ORDINARY
    return {"GDC": True, "launch_pdl": True}
