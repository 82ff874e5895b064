"""Q8_0Layout: where each int8 value and f16 scale of a Q8_0 matrix (or expert stack) lives in memory.

Every Q8_0 kernel addresses value ``(e, n, k)`` and scale ``(e, n, b)`` (``b = k // 32``) through it:

    value: ``e * expert + (n // 64) * row_tile + (n % 64) * row + (k // 32) * block + (k % 32) * element``
    scale: ``e * scale_expert + (n // 64) * scale_row_tile + (n % 64) * scale_row + b * scale_block``

in elements from the start of the ``qs`` / ``scales`` tensors. Two layouts fill it in:

- **row-major** (as in the GGUF file): the tensors' own strides, ``row_tile = 64 * row``,
  ``block = 32 * element``;
- **panels**: each 32-value block column of a matrix is one contiguous ``(out, 32)`` panel (values
  ``(…, in/32, out, 32)``, scales ``(…, in/32, out)``). The decode kernels' programs of one expert walk
  K in step, so at any moment they read neighbouring runs of one panel instead of 32-byte pieces of
  rows 2 KiB apart.

The kernels compute the same products in the same order from either layout (bit-identical results).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROW_TILE = 64  # the kernels' address split of a row index (n // 64, n % 64); any layout's strides fit it
BLOCK = 32  # one Q8_0 block


@dataclass(frozen=True)
class Q8_0Layout:
    """Element strides of values and scales (module doc); ``expert`` strides are 0 for a 2-D matrix."""

    expert: int
    row_tile: int
    row: int
    block: int
    element: int
    scale_expert: int
    scale_row_tile: int
    scale_row: int
    scale_block: int

    @property
    def value_strides(self) -> tuple[int, int, int, int, int]:
        return (self.expert, self.row_tile, self.row, self.block, self.element)

    @property
    def scale_strides(self) -> tuple[int, int, int, int]:
        return (self.scale_expert, self.scale_row_tile, self.scale_row, self.scale_block)

    @property
    def panels(self) -> bool:
        """True for the panel layout (rows of one block column contiguous, 32 bytes apart)."""
        return self.row == BLOCK and self.element == 1 and self.scale_row == 1


def row_major_layout(qs: torch.Tensor, scales: torch.Tensor) -> Q8_0Layout:
    """The layout of a ``(…, out, in)`` value tensor and its ``(…, out, in / 32)`` scales (any strides)."""
    stack = qs.dim() == 3
    row, element = qs.stride(-2), qs.stride(-1)
    scale_row, scale_block = scales.stride(-2), scales.stride(-1)
    return Q8_0Layout(
        expert=qs.stride(0) if stack else 0, row_tile=ROW_TILE * row, row=row, block=BLOCK * element,
        element=element, scale_expert=scales.stride(0) if stack else 0, scale_row_tile=ROW_TILE * scale_row,
        scale_row=scale_row, scale_block=scale_block,
    )


def panel_layout(out_features: int, in_features: int, stack: bool) -> Q8_0Layout:
    """The layout of contiguous panels: values ``(…, in/32, out, 32)``, scales ``(…, in/32, out)``."""
    return Q8_0Layout(
        expert=out_features * in_features if stack else 0, row_tile=ROW_TILE * BLOCK, row=BLOCK,
        block=out_features * BLOCK, element=1, scale_expert=out_features * (in_features // BLOCK) if stack else 0,
        scale_row_tile=ROW_TILE, scale_row=1, scale_block=out_features,
    )
