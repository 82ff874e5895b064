"""tiled_linear: ``x @ W.T`` for a packed ``W``, dequantized a bounded tile of rows at a time.

The reference matmul of every packed format off the Triton path: only one tile of the dense matrix
ever exists, and the tiles depend on the weight's shape only, so every call reduces in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Rows = Callable[[int, int, torch.dtype], torch.Tensor]  # (lo, hi, dtype) -> dense rows lo..hi (hi - lo, in)


def tiled_linear(x: torch.Tensor, out_features: int, in_features: int, rows_of: Rows, tile_elements: int) -> torch.Tensor:
    """``x (..., in)`` -> ``(..., out)`` in ``x``'s dtype, ``tile_elements`` dequantized values a tile."""
    rows = max(1, tile_elements // in_features)
    if rows >= out_features:
        return torch.nn.functional.linear(x, rows_of(0, out_features, x.dtype))
    y = x.new_empty((*x.shape[:-1], out_features))
    for lo in range(0, out_features, rows):
        hi = min(lo + rows, out_features)
        y[..., lo:hi] = torch.nn.functional.linear(x, rows_of(lo, hi, x.dtype))
    return y
