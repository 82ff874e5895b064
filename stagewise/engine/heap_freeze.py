"""freeze_heap: keep the garbage collector's full passes off the objects that live as long as the process.

A loaded model and the server's imports leave some 340,000 long-lived objects (modules, parameters,
Triton's and torch's caches); a full collection walks them all: 174 ms on the 2-core CPU machine with
random:tiny-llama loaded, a stall of every stream at once whenever enough survivors pile up to trigger
one. Moving them to the permanent generation once everything is loaded (as vLLM's engine does) leaves
later collections only the objects made since, which are what serving creates and drops.
"""

from __future__ import annotations

import atexit
import gc

_frozen: list[bool] = []


def freeze_heap() -> None:
    """Collect once, then exempt every surviving object from later collections (call when loaded).

    Unfrozen at exit: the interpreter's last collection then frees them as usual (frozen, native
    extensions report them as leaked)."""
    gc.collect()
    gc.freeze()
    if not _frozen:
        _frozen.append(True)
        atexit.register(gc.unfreeze)
