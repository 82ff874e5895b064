"""KernelVariants: which specializations of the Triton kernels a process launches, keyed as Triton keys them.

Triton compiles a kernel once per *specialization*: the values of its ``tl.constexpr`` arguments, each
other integer argument's class (equal to 1, divisible by 16, neither; not for those named in
``do_not_specialize``), each pointer's alignment (16 bytes or not), the argument types, and the launch
options (``num_warps``, ``num_stages``, ...). A launch with a new specialization compiles (hundreds of
milliseconds to seconds on a machine without Triton's disk cache); that is what warm-up must run ahead
of the first request (:mod:`stagewise.engine.warm_up`).

:class:`VariantLog` records, while it is open, every launch's specialization, computed with Triton's own
binder (``create_function_from_signature`` over the kernel's parameters), on a GPU or under Triton's
interpreter on the host, where nothing is compiled: tests count the variants a workload adds after
warm-up. :func:`compiled_variants` counts the kernels the GPU's in-process caches hold (what was really
compiled), for the device benchmarks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, create_function_from_signature

KERNEL_PACKAGE = "stagewise.kernels"


@dataclass(frozen=True)
class Variant:
    """One specialization: the kernel (``module:name``) and its key (argument classes and launch options)."""

    kernel: str
    key: str


def int_class(value: int) -> str:
    """An integer argument's class as Triton specializes on it: ``1``, ``16`` (divisible by 16) or ``other``."""
    return "1" if value == 1 else "16" if value % 16 == 0 else "other"


def _describe(value: Any) -> str:
    """A constexpr's or option's value as text (dtypes and Triton's types have no stable equality)."""
    return repr(value)


@dataclass
class VariantLog:
    """While open (``with``), every launch of a Triton kernel of this process adds its :class:`Variant`."""

    variants: set[Variant] = field(default_factory=set)
    launches: int = 0
    _binders: dict[int, Callable[..., Any]] = field(default_factory=dict)
    _saved: list[tuple[Any, Callable[..., Any]]] = field(default_factory=list)  # (kernel class, its run)

    def __enter__(self) -> VariantLog:
        classes: tuple[Any, ...] = (JITFunction, InterpretedFunction)
        for cls in classes:
            original = cls.run
            self._saved.append((cls, original))
            cls.run = self._wrap(original)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        while self._saved:
            cls, original = self._saved.pop()
            cls.run = original

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        log = self

        def run(kernel: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            log.record(kernel, args, kwargs)
            return original(kernel, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    def record(self, kernel: JITFunction[Any] | InterpretedFunction[Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Variant:
        """Add the variant of one launch of ``kernel`` (its arguments and launch options) and return it."""
        binder = self._binders.get(id(kernel))
        if binder is None:
            jit = kernel if isinstance(kernel, JITFunction) else _as_jit(kernel)
            binder = create_function_from_signature(jit.signature, jit.params, BaseBackend)
            self._binders[id(kernel)] = binder
        _, specialization, options = binder(*args, **kwargs)
        text = ";".join(f"{kind}:{_describe(value)}" for kind, value in specialization)
        text += "|" + ",".join(f"{name}={_describe(options[name])}" for name in sorted(options))
        variant = Variant(f"{kernel.fn.__module__}:{kernel.fn.__name__}", text)
        self.variants.add(variant)
        self.launches += 1
        return variant


def _as_jit(kernel: InterpretedFunction[Any]) -> JITFunction[Any]:
    """The JIT function an interpreted kernel would be on a GPU (its parameters, with the same
    ``do_not_specialize`` lists); nothing is compiled."""
    keep = ("do_not_specialize", "do_not_specialize_on_alignment")
    return JITFunction(kernel.fn, **{k: v for k, v in kernel.kwargs.items() if k in keep})


def compiled_variants() -> int:
    """Kernels this process's Triton caches hold for the kernels of :data:`KERNEL_PACKAGE`, over every
    device (0 under the interpreter, which compiles nothing)."""
    total = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith(KERNEL_PACKAGE) or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, JITFunction):
                total += sum(len(caches[0]) for caches in value.device_caches.values())
    return total
