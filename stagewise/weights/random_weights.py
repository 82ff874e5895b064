"""Deterministic random values for every parameter of a made-up model.

Each tensor has its own generator seeded from (seed, name), and is produced in chunks along dim 0
whose size depends only on the shape, so a tensor's values never depend on which other tensors
exist, on the output format, or on memory: the GGUF and safetensors writers see the same values.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import torch

from stagewise.spec.model_config import ModelConfig

CHUNK_ELEMENTS = 1 << 24  # 64 MiB of float32 per chunk
WEIGHT_STD = 0.02


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def chunk_rows(shape: tuple[int, ...]) -> int:
    """Rows (along dim 0) per chunk for a tensor of ``shape``."""
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    return max(1, CHUNK_ELEMENTS // max(row, 1))


def tensor_chunks(config: ModelConfig, name: str, shape: tuple[int, ...], seed: int,
                  device: str = "cpu") -> Iterator[torch.Tensor]:
    """float32 chunks of parameter ``name`` along dim 0, concatenating to ``shape``.

    ``device`` draws the values there (a CUDA generator gives other values than the CPU one for
    the same seed: files made on a GPU are deterministic, but not byte-equal to CPU-made ones).
    """
    gen = torch.Generator(device=device).manual_seed(tensor_seed(seed, name))
    rows = chunk_rows(shape)
    for lo in range(0, shape[0], rows):
        n = min(rows, shape[0] - lo)
        yield _values(config, name, (n, *shape[1:]), gen)


def _values(config: ModelConfig, name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen, device=gen.device)  # drawn first for every tensor
    if name.endswith("A_log"):
        a = torch.rand(shape, generator=gen, device=gen.device) * 15 + 1  # A in [1, 16), as the reference initializes it
        return _exp_log_fixed_point(torch.log(a))
    if name.endswith("dt_bias"):
        return 1.0 + 0.1 * noise
    if name.endswith("conv1d.weight"):
        return 0.2 * noise
    if name.endswith("norm.weight"):
        zero_centred = config.zero_centered_norm and ".linear_attn." not in name
        return 0.05 * noise if zero_centred else 1.0 + 0.1 * noise
    return WEIGHT_STD * noise  # matrices and biases


def _exp_log_fixed_point(x: torch.Tensor) -> torch.Tensor:
    # GGUF stores -exp(A_log); choose values that survive exp then log unchanged in float32, so the
    # same model read from either format has bit-identical parameters
    for _ in range(8):
        y = torch.log(torch.exp(x))
        if torch.equal(y, x):
            break
        x = y
    return x
