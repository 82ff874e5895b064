"""The kernel side of programmatic dependent launch (see ``triton_launch.dependent_launch``)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_predecessor(GDC: tl.constexpr):  # type: ignore[no-untyped-def]
    """A dependent-launch kernel's first call: wait until the previous kernel has finished and its
    writes are visible, then let the next kernel launch into the programs this one frees. A no-op
    when ``GDC`` is False (launched the ordinary way)."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
