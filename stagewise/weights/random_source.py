"""RandomSource: deterministic random weights for any geometry, generated on the target device.

Used by benchmarks and device-side tests (``random:CONFIG``) where writing a multi-GB file first
would only measure the disk. Each tensor's values depend on the seed and the tensor's name alone,
so any placement of the same model sees the same weights.
"""

from __future__ import annotations

import math

import torch

from stagewise.errors import WeightsError
from stagewise.models.layers.quantized_weight import QuantizedWeight
from stagewise.models.registry import parameter_shapes
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.random_weights import tensor_seed

_DENSE_ONLY = ("embed_tokens", "mlp.gate.weight", "shared_expert_gate", "conv1d", "norm")


class RandomSource:
    """Every parameter of ``config``'s full model, drawn on demand.

    With ``fmt="q8_0"`` the projection matrices (experts and LM head included) are drawn directly
    in their packed Q8_0 form on the device (random int8 values, scales giving ~``std``), as a
    llama.cpp Q8_0 file keeps them; embeddings, norms, the router and other small tensors stay dense.
    """

    def __init__(self, config: ModelConfig, seed: int = 0, std: float = 0.02, fmt: str = "dense") -> None:
        if fmt not in ("dense", "q8_0"):
            raise WeightsError(f"random weights: format {fmt!r} must be dense or q8_0")
        self.config = config
        self.seed = seed
        self.std = std
        self.fmt = fmt
        self._shapes = dict(parameter_shapes(config))

    @property
    def label(self) -> str:
        return f"random:{self.config.architecture} (seed {self.seed})"

    def names(self) -> set[str]:
        return set(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def is_quantized(self, name: str) -> bool:
        shape = self._shapes[name]
        return (self.fmt == "q8_0" and len(shape) >= 2 and shape[-1] % 32 == 0
                and not any(part in name for part in _DENSE_ONLY))

    def source_bytes(self, name: str) -> int:
        """Packed bytes of a Q8_0 tensor: 34 bytes per 32 values (int8 + f16 scale)."""
        return math.prod(self._shapes[name]) // 32 * 34

    def load(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        shape = self._shapes[name]
        gen = torch.Generator(device=device).manual_seed(tensor_seed(self.seed, name))
        leaf = name.rsplit(".", 1)[-1]
        if "norm" in name:  # around 1, or around 0 where the model stores offsets from 1
            base = 0.0 if self.config.zero_centered_norm else 1.0
            values = base + 0.05 * torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        elif leaf == "A_log":
            values = torch.empty(shape, device=device, dtype=torch.float32).uniform_(0.0, 2.0, generator=gen)
        elif leaf == "dt_bias":
            values = torch.ones(shape, device=device, dtype=torch.float32)
        else:
            values = self.std * torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        return values.to(dtype)

    def load_quantized(self, name: str, device: torch.device) -> QuantizedWeight:
        if not self.is_quantized(name):
            raise WeightsError(f"{self.label}: tensor {name!r} is not quantized")
        from stagewise.weights.quant.q8_0 import Q8_0Weight

        shape = self._shapes[name]
        gen = torch.Generator(device=device).manual_seed(tensor_seed(self.seed, name))
        qs = torch.randint(-127, 128, shape, generator=gen, device=device, dtype=torch.int8)
        scale = self.std / 73.0  # uniform int8 in [-127, 127] has a standard deviation of ~73
        scales = torch.full((*shape[:-1], shape[-1] // 32), scale, dtype=torch.float16, device=device)
        return Q8_0Weight(qs, scales)  # type: ignore[return-value]

    def ignored(self) -> set[str]:
        return set()
