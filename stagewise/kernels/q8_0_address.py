"""Q8_0 addresses: the offsets of values and scales under a :class:`~stagewise.weights.quant.q8_0_layout.Q8_0Layout`.

Shared by every Q8_0 kernel (decode GEMM, prefill GEMM, GEMV), so the row-major and the panel layout
are read through one formula: row ``n`` -> ``(n // 64) * row_tile + (n % 64) * row``, column ``k`` ->
``(k // 32) * block + (k % 32) * element``. With the layout's strides as kernel arguments, Triton
specializes a stride of 1 and sees the 32-element runs as contiguous.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def row_offsets(n, row_tile, row):  # type: ignore[no-untyped-def]
    """Offsets (int64) of rows ``n`` (any shape): their 64-row tile, then the row inside it."""
    return (n // 64).to(tl.int64) * row_tile + (n % 64).to(tl.int64) * row


@triton.jit
def column_offsets(k, block, element):  # type: ignore[no-untyped-def]
    """Offsets of columns ``k`` (any shape): their 32-value Q8_0 block, then the value inside it."""
    return (k // 32) * block + (k % 32) * element
