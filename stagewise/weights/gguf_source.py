"""GGUFSource: a GGUF model (single or split file) as a :class:`TensorSource` in our naming.

Each tensor is read from the file mapping and placed straight on the requested device, with the
converter's layout and value changes undone (:mod:`stagewise.weights.gguf_layout`). Dispatch is
on each tensor's own ggml type, never on ``general.file_type``. Q8_0 matrices stay packed
(:class:`Q8_0Weight`), every other packed type as the file's blocks (:class:`PackedWeight`), each
tensor in its own type; F32 read on CPU at float32 is a view of the mapping (no copy).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

import torch
from gguf.constants import GGMLQuantizationType

from stagewise.errors import CorruptModelFile, UnsupportedArchitecture, WeightsError
from stagewise.models.layers.quantized_weight import QuantizedWeight
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.packed_types import row_bytes
from stagewise.weights.gguf_layout import col_group_index, expand_groups, row_index, value_from_gguf
from stagewise.weights.gguf_table import GGUFTable
from stagewise.weights.quant.block_scales import check_block_scales
from stagewise.weights.quant.packed_planes import planes_from_rows
from stagewise.weights.quant.packed_weight import PackedWeight
from stagewise.weights.quant.q8_0 import BLOCK, Q8_0Weight
from stagewise.weights.quant.tensor_decode import decode_dense, decode_to


class GGUFSource:
    """Tensors of one GGUF model, read lazily, each straight to its device."""

    def __init__(self, path: str | Path) -> None:
        self.table = GGUFTable(path)  # names, shapes, types and the packed rule, from the headers
        self.file = self.table.file
        self.config: ModelConfig = self.table.config
        self._check_shapes()

    # --- TensorSource -------------------------------------------------------------------------
    @property
    def label(self) -> str:
        return self.table.label

    @property
    def fields(self) -> dict[str, Any]:
        """GGUF metadata (key -> plain Python value), e.g. for the tokenizer."""
        return self.table.fields

    def names(self) -> set[str]:
        return self.table.names()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.table.shape(name)

    def ignored(self) -> set[str]:
        return self.table.ignored()

    def source_bytes(self, name: str) -> int:
        """Bytes the tensor occupies in the file (all its GGUF parts)."""
        return self.table.source_bytes(name)

    def ggml_type(self, name: str) -> GGMLQuantizationType:
        """The stored type of ``name`` (its first GGUF part's)."""
        return self.table.part_types(name)[0]

    def is_quantized(self, name: str) -> bool:
        """Resident packed (:meth:`GGUFTable.is_quantized`, the one rule the planner charges by)."""
        return self.table.is_quantized(name)

    def input_index_elements(self, name: str) -> int:
        """Values of the int64 input gather ``load_packed`` gives ``name`` (0: none)."""
        return self.table.input_index_elements(name)

    def load(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        rule = self.table.rule(name)
        if len(rule.gguf) == 1:  # straight to the run dtype, dequantized in bounded slabs
            info = self.file.info(rule.gguf[0])
            parts = [decode_to(self.file.raw(rule.gguf[0]), info.ggml_type, info.shape, device, dtype)]
        else:
            parts = [self._dense(g, device) for g in rule.gguf]
        self._release(rule.gguf, device)
        if len(parts) > 1:
            common = parts[0].dtype if all(p.dtype == parts[0].dtype for p in parts) else torch.float32
            tensor = torch.cat([p.to(common) for p in parts], dim=rule.rule.concat_dim)
        else:
            tensor = parts[0]
        rows = row_index(rule.rule, self.config, tensor.shape[0])
        if rows is not None:
            tensor = tensor.index_select(0, rows.to(tensor.device))
        cols = col_group_index(rule.rule, self.config)
        if cols is not None:
            tensor = tensor.index_select(1, expand_groups(*cols).to(tensor.device))
        tensor = value_from_gguf(rule.rule, tensor)
        return tensor.to(dtype=dtype)

    def load_quantized(self, name: str, device: torch.device) -> QuantizedWeight:
        if not self.is_quantized(name):
            raise WeightsError(f"{self.label}: tensor {name!r} is not resident-quantized")
        if self.ggml_type(name) == GGMLQuantizationType.Q8_0:
            return cast(QuantizedWeight, self.load_q8_0(name, device))
        return cast(QuantizedWeight, self.load_packed(name, device))

    def load_packed(self, name: str, device: torch.device) -> PackedWeight:
        """``name`` as a :class:`PackedWeight` on ``device``: the file's blocks, re-laid-out by whole rows
        (row permutations, concatenations); a column permutation becomes the weight's input gather."""
        rule = self.table.rule(name)
        parts = []
        for g in rule.gguf:  # repacked into planes on the device, a bounded slab of rows at a time
            info = self.file.info(g)
            raw = self.file.raw(g).reshape(*info.shape[:-1], row_bytes(info.ggml_type, info.shape[-1]))
            planes = planes_from_rows(raw, info.ggml_type, info.shape[-1], device,
                                      check=functools.partial(check_block_scales, ggml_type=info.ggml_type,
                                                              label=self.label, tensor=g))
            parts.append(PackedWeight(*planes, info.ggml_type, info.shape[-1]))
        self._release(rule.gguf, device)
        weight = parts[0] if len(parts) == 1 else PackedWeight.concat(parts, rule.rule.concat_dim)
        rows = row_index(rule.rule, self.config, weight.shape[0])
        if rows is not None:
            weight = weight.select_rows(rows) if weight.qs.dim() == 2 else weight.select_experts(rows)
        cols = col_group_index(rule.rule, self.config)
        if cols is not None:  # ours[:, j] = file[:, p[j]]  =>  ours @ x = file @ x[p^-1]
            perm = expand_groups(*cols).to(device)
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(perm.numel(), device=device)
            weight = PackedWeight(*weight.planes, weight.ggml_type, weight.in_features, inverse)
        return weight

    def load_q8_0(self, name: str, device: torch.device) -> Q8_0Weight:
        """``name`` as a :class:`Q8_0Weight` on ``device`` (2-D, or 3-D for stacked experts)."""
        rule = self.table.rule(name)
        parts = [Q8_0Weight.from_blocks(self.file.raw(g), self.file.info(g).shape, device) for g in rule.gguf]
        for g, part in zip(rule.gguf, parts, strict=True):  # checked on the device, after the copy
            if not bool(torch.isfinite(part.scales).all()):
                raise CorruptModelFile(f"{self.label}: tensor {g!r} (Q8_0) has a NaN or infinite block scale")
        self._release(rule.gguf, device)
        weight = parts[0]
        if len(parts) > 1:
            dim = rule.rule.concat_dim
            weight = Q8_0Weight(torch.cat([p.qs for p in parts], dim), torch.cat([p.scales for p in parts], dim))
        rows = row_index(rule.rule, self.config, weight.shape[0])
        if rows is not None:
            rows = rows.to(device)
            weight = Q8_0Weight(weight.qs.index_select(0, rows), weight.scales.index_select(0, rows))
        cols = col_group_index(rule.rule, self.config)
        if cols is not None:
            index, group = cols
            blocks = expand_groups(index, group // BLOCK).to(device)
            qs = weight.qs.unflatten(-1, (-1, BLOCK)).index_select(-2, blocks).flatten(-2)
            weight = Q8_0Weight(qs.contiguous(), weight.scales.index_select(-1, blocks).contiguous())
        return weight

    # --- internals -----------------------------------------------------------------------------
    def _release(self, gguf_names: tuple[str, ...] | list[str], device: torch.device) -> None:
        if device.type != "cpu":  # the bytes now live on the device: unmap the host pages
            for g in gguf_names:
                self.file.release(g)

    def _dense(self, gguf_name: str, device: torch.device) -> torch.Tensor:
        info = self.file.info(gguf_name)
        return decode_dense(self.file.raw(gguf_name), info.ggml_type, info.shape, device)

    def _check_shapes(self) -> None:
        """Every tensor's shape against the shapes the metadata implies (the model built on meta)."""
        from stagewise.models.registry import build_stage

        try:
            model = build_stage(self.config, 0, self.config.num_layers, entry=True, exit=True)
        except UnsupportedArchitecture:
            return  # the family's model is not available; the stage loader checks shapes later
        expected = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
        for name in self.table.names_in_order():  # the first mismatch reported is the first bound
            shape = self.shape(name)
            want = expected.get(name)
            if want is not None and want != shape:
                raise CorruptModelFile(
                    f"{self.label}: tensor {self.table.rule(name).gguf[0]!r} has shape {list(shape)}, "
                    f"but the metadata implies {list(want)}"
                )

