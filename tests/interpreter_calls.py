"""Device-function calls under Triton's interpreter without re-patching ``triton.language`` on each call.

Triton's interpreter (``TRITON_INTERPRET=1``, how the tests run kernels without a GPU) patches the language
modules' builtins when a launch starts and restores them when it ends. But a call of one ``@triton.jit``
function from another (``InterpretedFunction.__call__``) patches again, scanning every member of
``triton.language``, its tensor class and ``math`` with ``inspect.getmembers`` (~1 ms; triton 3.9), although
they are patched already. Kernels that call helpers inside their loops spend most of their interpreted time
there (the decode-attention split kernel: 2.4 s a launch, 0.35 s with this and its empty ranges skipped).

:func:`install` makes a device-function call patch only when a language module its function sees is not
patched yet (its ``full`` still a builtin): what Triton would have patched on that call, and nothing else.
Kernels compute the same; only the interpreter's bookkeeping is skipped. Without the internals this relies
on (another Triton), it warns and leaves the interpreter as it is (slower, same results).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def install() -> None:
    """Replace ``InterpretedFunction.__call__`` as the module note says (once; the tests' session only)."""
    import triton.language as tl

    try:
        from triton.runtime import interpreter
        original: Callable[..., Any] = interpreter.InterpretedFunction.__call__
        error = interpreter.InterpreterError
        is_builtin = tl.core.is_builtin
    except AttributeError as missing:
        warnings.warn(f"Triton's interpreter changed ({missing}): device-function calls re-patch the language "
                      "on every call (tests slower, results the same)", stacklevel=2)
        return
    if getattr(original, "_patches_once", False):
        return
    langs_of: dict[Any, tuple[Any, ...]] = {}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        langs = langs_of.get(self.fn)
        if langs is None:
            seen = {id(v): v for v in self.fn.__globals__.values() if v is tl or v is tl.core}
            langs = langs_of[self.fn] = tuple(seen.values())
        if not langs or any(is_builtin(lang.full) for lang in langs):
            return original(self, *args, **kwargs)  # a language module it sees is not patched: Triton's own call
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as Triton's call reports a device function's error
            raise error(repr(e)) from e

    call._patches_once = True  # type: ignore[attr-defined]
    interpreter.InterpretedFunction.__call__ = call
