"""GGUFTable: a GGUF model's tensors in our naming, from its headers alone (no torch).

The metadata half of :class:`~stagewise.weights.gguf_source.GGUFSource`: the config, each of our
tensors' GGUF parts, logical shape, stored type and file bytes, and whether the loader keeps it
packed. ``plan`` / ``assess`` read a GGUF through this, so they charge each tensor by its own type
without importing torch; ``tests/test_gguf_table.py`` holds it equal to ``GGUFSource``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from stagewise.errors import CorruptModelFile, UnsupportedTensorType, WeightsError
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.packed_types import SUPPORTED, is_packed
from stagewise.weights.gguf_config import config_from_gguf
from stagewise.weights.gguf_file import GGUFFile
from stagewise.weights.gguf_names import BoundRule, bind_gguf_names, blocks_present

_Q8_0_BLOCK = 32
_NUMPY_FLOATS = {GGMLQuantizationType.F32: "<f4", GGMLQuantizationType.F16: "<f2"}


class GGUFTable:
    """Our tensors of one GGUF model (single or split): names, shapes, types and bytes."""

    def __init__(self, path: str | Path) -> None:
        self.file = GGUFFile(path)
        names = set(self.file.tensors)
        embd = self.file.info("token_embd.weight").shape if "token_embd.weight" in names else None
        self.config: ModelConfig = config_from_gguf(
            self.file.fields, self.label, embedding_shape=embd, rope_factors=self._rope_factors,
            has_output="output.weight" in names, blocks_present=blocks_present(names),
        )
        bound, self._ignored = bind_gguf_names(self.config.architecture, names, self.config.num_layers,
                                                  label=self.label)
        self._rules: dict[str, BoundRule] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        for rule in bound:
            if rule.ours in self._rules:
                raise WeightsError(f"{self.label}: two GGUF tensors map to {rule.ours!r}")
            missing = [g for g in rule.gguf if g not in names]
            if missing:
                raise WeightsError(f"{self.label}: tensor {missing[0]!r} is missing (needed with {rule.gguf[0]!r})")
            for g in rule.gguf:
                self._check_supported(g)
            self._rules[rule.ours] = rule
            self._shapes[rule.ours] = self._logical_shape(rule)

    @property
    def label(self) -> str:
        return str(self.file.path)

    def names(self) -> set[str]:
        return set(self._rules)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def ignored(self) -> set[str]:
        return set(self._ignored)

    def names_in_order(self) -> list[str]:
        """Our tensor names in the order the name rules bind them (blocks in file order)."""
        return list(self._rules)

    def rule(self, name: str) -> BoundRule:
        """How ``name`` is made from its GGUF parts (names, concatenation, layout, value change)."""
        return self._rules[name]

    def part_types(self, name: str) -> list[GGMLQuantizationType]:
        """The stored type of each GGUF part of ``name``."""
        return [self.file.info(g).ggml_type for g in self._rules[name].gguf]

    def source_bytes(self, name: str) -> int:
        """Bytes the tensor occupies in the file (all its GGUF parts)."""
        return sum(self.file.info(g).nbytes for g in self._rules[name].gguf)

    def is_quantized(self, name: str) -> bool:
        """The rule of ``GGUFSource.is_quantized``: every part of one packed type, stored with the
        logical number of dimensions and no value change; Q8_0 column moves in whole blocks."""
        rule = self._rules[name]
        types = set(self.part_types(name))
        if len(types) != 1 or not is_packed(next(iter(types))):
            return False
        shape = self._shapes[name]
        if len(shape) < 2 or rule.rule.value in ("norm_offset", "a_log", "conv"):
            return False
        if any(len(self.file.info(g).shape) != len(shape) for g in rule.gguf):
            return False
        if next(iter(types)) != GGMLQuantizationType.Q8_0 or rule.rule.layout != "v_cols":
            return True
        nk, nv = self.config.linear_num_key_heads, self.config.linear_num_value_heads
        moves = nk != 0 and nv != nk  # the value-head column permutation of gguf_layout.col_group_index
        return not moves or self.config.linear_value_head_dim % _Q8_0_BLOCK == 0

    def input_index_elements(self, name: str) -> int:
        """Values of the int64 input gather a packed weight of ``name`` keeps (the value-head column
        permutation of a packed, non-Q8_0 ``out_proj``: ``GGUFSource.load_packed``); 0 otherwise."""
        if not self.is_quantized(name) or self.part_types(name)[0] == GGMLQuantizationType.Q8_0:
            return 0
        if self._rules[name].rule.layout != "v_cols":
            return 0
        nk, nv = self.config.linear_num_key_heads, self.config.linear_num_value_heads
        return self._shapes[name][-1] if nk != 0 and nv != nk else 0

    def _check_supported(self, gguf_name: str) -> None:
        ggml_type = self.file.info(gguf_name).ggml_type
        if ggml_type not in SUPPORTED:
            supported = ", ".join(sorted(t.name for t in SUPPORTED))
            raise UnsupportedTensorType(f"{self.label}: tensor {gguf_name!r} has type {ggml_type.name} "
                                        f"(supported: {supported})")

    @property
    def fields(self) -> dict[str, Any]:
        return self.file.fields

    def _rope_factors(self) -> list[float] | None:
        if "rope_freqs.weight" not in self.file.tensors:
            return None
        index, info = self.file.tensors["rope_freqs.weight"]
        if info.ggml_type == GGMLQuantizationType.BF16:  # the high half of a float32
            bits = np.fromfile(self.file.parts[index], dtype="<u2", count=info.nbytes // 2, offset=info.offset_bytes)
            return [float(v) for v in (bits.astype(np.uint32) << 16).view(np.float32)]
        dtype = _NUMPY_FLOATS.get(info.ggml_type)
        if dtype is None:
            raise CorruptModelFile(f"{self.label}: rope_freqs.weight has type {info.ggml_type.name}, "
                                   "expected F32, F16 or BF16")
        count = info.nbytes // np.dtype(dtype).itemsize
        values = np.fromfile(self.file.parts[index], dtype=dtype, count=count, offset=info.offset_bytes)
        return [float(v) for v in values]

    def _logical_shape(self, rule: BoundRule) -> tuple[int, ...]:
        shapes = [self.file.info(g).shape for g in rule.gguf]
        dim = rule.rule.concat_dim
        first = list(shapes[0])
        for other in shapes[1:]:
            if len(other) != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, other, strict=True))
                                               if i != dim):
                raise CorruptModelFile(
                    f"{self.label}: tensor {rule.gguf[1]!r} shape {list(other)} does not match {rule.gguf[0]!r} {first}"
                )
            first[dim] += other[dim]
        if rule.rule.value == "conv" and len(first) == 2:
            first.insert(1, 1)  # stored squeezed: (C, K) -> (C, 1, K)
        if rule.rule.value == "row" and len(first) == 1:
            first.insert(0, 1)  # stored 1-D: (H,) -> (1, H)
        return tuple(first)
