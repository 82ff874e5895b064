"""RandomSource: deterministic random weights for any geometry, generated on the target device.

Used by benchmarks and device-side tests (``random:CONFIG``) where writing a multi-GB file first
would only measure the disk. Each tensor's values depend on the seed and the tensor's name alone,
so any placement of the same model sees the same weights.
"""

from __future__ import annotations

import math

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.errors import WeightsError
from stagewise.models.layers.quantized_weight import QuantizedWeight
from stagewise.models.registry import parameter_shapes
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.packed_types import (
    PACKED,
    PLANES,
    block_elements,
    format_name,
    is_packed,
    plane_row_bytes,
    row_bytes,
)
from stagewise.spec.quant_presets import PRESETS
from stagewise.weights.random_weights import tensor_seed

_PACKED_FORMATS = {format_name(t): t for t in PACKED}
# llama.cpp's mixes (``q4_k_m`` …): each tensor the type make-model and llama-quantize give it
MIXES = frozenset(name for name, p in PRESETS.items() if p.mix and name not in _PACKED_FORMATS)
# scale field per unit of std for random blocks (the inverse of a typical |quantized value| x sub-scale)
_SCALE = {GGMLQuantizationType.Q4_0: 1 / 5, GGMLQuantizationType.Q4_1: 1 / 9, GGMLQuantizationType.Q5_0: 1 / 9,
          GGMLQuantizationType.Q5_1: 1 / 18, GGMLQuantizationType.Q2_K: 1 / 20, GGMLQuantizationType.Q3_K: 1 / 100,
          GGMLQuantizationType.Q4_K: 1 / 250, GGMLQuantizationType.Q5_K: 1 / 500, GGMLQuantizationType.Q6_K: 1 / 1300,
          GGMLQuantizationType.IQ4_NL: 1 / 60, GGMLQuantizationType.IQ4_XS: 1 / 1000}
_DENSE_ONLY = ("embed_tokens", "mlp.gate.weight", "shared_expert_gate", "conv1d", "norm")


class RandomSource:
    """Every parameter of ``config``'s full model, drawn on demand.

    With ``fmt="q8_0"`` (or any other packed type of :mod:`~stagewise.spec.packed_types`,
    e.g. ``q4_k``) the projection matrices (experts and LM head included) are drawn directly in
    their packed form on the device (random block bytes, scale fields set so values are ~``std``),
    as a llama.cpp file keeps them; rows that do not divide into the type's blocks, embeddings,
    norms, the router and other small tensors stay dense. With a mix of :data:`MIXES` (``q4_k_m``)
    each of those matrices takes the type a file of that mix stores it in (llama.cpp's per-tensor
    rules, :func:`~stagewise.weights.gguf_export.stored_types`: Q6_K for Llama's ``attn_v``, half of
    ``ffn_down`` and the head), dense where its parts differ in type, as a GGUF file's would load.
    """

    def __init__(self, config: ModelConfig, seed: int = 0, std: float = 0.02, fmt: str = "dense") -> None:
        if fmt != "dense" and fmt not in _PACKED_FORMATS and fmt not in MIXES:
            raise WeightsError(f"random weights: format {fmt!r} must be dense or one of "
                               f"{', '.join(sorted(_PACKED_FORMATS) + sorted(MIXES))}")
        self.config = config
        self.seed = seed
        self.std = std
        self.fmt = fmt
        self._shapes = dict(parameter_shapes(config))
        self._types = self._packed_types()

    def _packed_types(self) -> dict[str, GGMLQuantizationType]:
        """The type of every parameter drawn packed (the rest are dense)."""
        if self.fmt == "dense":
            return {}
        candidates = {name: shape for name, shape in self._shapes.items()
                      if len(shape) >= 2 and not any(part in name for part in _DENSE_ONLY)}
        if self.fmt in _PACKED_FORMATS:
            qtype = _PACKED_FORMATS[self.fmt]
            return {name: qtype for name, shape in candidates.items() if shape[-1] % block_elements(qtype) == 0}
        from stagewise.weights.gguf_export import stored_types

        stored = stored_types(self.config, list(candidates.items()), self.fmt)
        return {name: types[0] for name, types in stored.items() if len(set(types)) == 1 and is_packed(types[0])}

    @property
    def label(self) -> str:
        return f"random:{self.config.architecture} (seed {self.seed})"

    def names(self) -> set[str]:
        return set(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def is_quantized(self, name: str) -> bool:
        return name in self._types

    def ggml_type(self, name: str) -> GGMLQuantizationType:
        """The packed type ``name`` is drawn in (:meth:`is_quantized` tensors only)."""
        return self._types[name]

    def source_bytes(self, name: str) -> int:
        """Packed bytes of a tensor: whole blocks of its type (Q8_0: 34 bytes per 32 values)."""
        shape = self._shapes[name]
        return math.prod(shape[:-1]) * row_bytes(self._types[name], shape[-1])

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
        qtype = self._types[name]
        if qtype != GGMLQuantizationType.Q8_0:
            return self._packed(shape, gen, device, qtype)  # type: ignore[return-value]
        qs = torch.randint(-127, 128, shape, generator=gen, device=device, dtype=torch.int8)
        scale = self.std / 73.0  # uniform int8 in [-127, 127] has a standard deviation of ~73
        scales = torch.full((*shape[:-1], shape[-1] // 32), scale, dtype=torch.float16, device=device)
        return Q8_0Weight(qs, scales)  # type: ignore[return-value]

    def _packed(self, shape: tuple[int, ...], gen: torch.Generator, device: torch.device,
                qtype: GGMLQuantizationType) -> object:
        """Random planes of ``qtype`` with every scale field set to ``_SCALE[type] * std``, generated
        straight into the resident planes (no file-row copy on the device)."""
        from stagewise.weights.quant.block_scales import F16_SCALE_OFFSETS
        from stagewise.weights.quant.packed_weight import PackedWeight

        layout = PLANES[qtype]
        qs, qh, meta = (torch.randint(0, 256, (*shape[:-1], n), generator=gen, device=device, dtype=torch.uint8)
                        for n in plane_row_bytes(qtype, shape[-1]))
        entries = meta.view(-1, layout.meta_bytes)  # one row per block
        if qtype == GGMLQuantizationType.MXFP4:
            entries[:, layout.meta_offset(0)] = 127 - 8  # E8M0 2**-8: |values| <= 6 * 2**-8
        else:
            scale = torch.tensor([self.std * _SCALE[qtype]], dtype=torch.float16, device=device).view(torch.uint8)
            for at in F16_SCALE_OFFSETS[qtype]:
                entries[:, layout.meta_offset(at) : layout.meta_offset(at) + 2] = scale
        return PackedWeight(qs, qh, meta, qtype, shape[-1])

    def ignored(self) -> set[str]:
        return set()
