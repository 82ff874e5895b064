"""``silu(gate) * up`` from a fused gate/up projection output, one Triton launch (the reference: two)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stagewise.kernels.grid_dependency import wait_for_predecessor
from stagewise.kernels.triton_launch import cdiv, dependent_launch, launch_device, next_power_of_2


@triton.jit
def _silu_mul_kernel(x_ptr, y_ptr, width, stride_x, BLOCK: tl.constexpr, GDC: tl.constexpr):
    wait_for_predecessor(GDC)
    row = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < width
    g = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_x + width + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * width + c, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up`` ``(..., 2I)`` (gate columns then up columns) -> ``silu(gate) * up`` ``(..., I)``, contiguous."""
    width = gate_up.shape[-1] // 2
    x = gate_up.reshape(-1, 2 * width)
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = torch.empty((*gate_up.shape[:-1], width), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, next_power_of_2(width))
    with launch_device(gate_up):
        _silu_mul_kernel[(x.shape[0], cdiv(width, block))](x, y, width, x.stride(0), BLOCK=block, num_warps=4,
                                                                **dependent_launch(x))
    return y
