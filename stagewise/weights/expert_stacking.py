"""Expert stacking: present per-expert checkpoint matrices as the stacked 3-D expert weights.

Hub checkpoints (and transformers 5.x ``save_pretrained``, which writes the original layout) store
MoE experts one matrix at a time::

    <p>.mlp.experts.<e>.gate_proj.weight  (I, H)
    <p>.mlp.experts.<e>.up_proj.weight    (I, H)
    <p>.mlp.experts.<e>.down_proj.weight  (H, I)

The model holds them stacked (transformers 5.x's in-memory layout)::

    <p>.mlp.experts.gate_up_proj  (E, 2I, H)   expert e: rows [0, I) gate, [I, 2I) up
    <p>.mlp.experts.down_proj     (E, H, I)

:func:`plan_expert_stacking` maps names and shapes (no tensor is read); :func:`load_stacked`
assembles one stacked tensor directly on its device, one expert matrix at a time, so host memory
holds at most one expert matrix.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from stagewise.errors import WeightsError

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


@dataclass(frozen=True)
class StackedTensor:
    """One stacked expert weight: ``parts[e]`` are the source names concatenated (dim 0) for expert ``e``."""

    name: str
    shape: tuple[int, int, int]
    parts: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        if len(self.parts) != self.shape[0]:
            raise ValueError(f"{self.name}: {len(self.parts)} experts for shape {self.shape}")


def plan_expert_stacking(shapes: dict[str, tuple[int, ...]], label: str) -> dict[str, StackedTensor]:
    """The stacked tensors the per-expert names in ``shapes`` form, keyed by stacked name.

    Raises:
        WeightsError: experts not numbered ``0..E-1``, a projection missing for some expert, or
            mismatched shapes (the message names the tensor).
    """
    groups: dict[str, dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for name in shapes:
        match = _PER_EXPERT.match(name)
        if match:
            groups[match["prefix"]][int(match["expert"])][match["proj"]] = name
    stacked: dict[str, StackedTensor] = {}
    for prefix, experts in groups.items():
        count = len(experts)
        if sorted(experts) != list(range(count)):
            missing = min(set(range(max(experts) + 1)) - set(experts))
            raise WeightsError(f"{label}: expert {missing} of {prefix!r} is missing")
        for e, projs in experts.items():
            for proj in ("gate_proj", "up_proj", "down_proj"):
                if proj not in projs:
                    raise WeightsError(f"{label}: missing tensor {prefix}.{e}.{proj}.weight")
        first = experts[0]
        gate = _shape2(shapes, first["gate_proj"], label)
        down = _shape2(shapes, first["down_proj"], label)
        for projs in experts.values():
            for proj, want in (("gate_proj", gate), ("up_proj", gate), ("down_proj", down)):
                got = tuple(shapes[projs[proj]])
                if got != want:
                    raise WeightsError(f"{label}: tensor {projs[proj]!r} has shape {list(got)}, expected {list(want)}")
        stacked[f"{prefix}.gate_up_proj"] = StackedTensor(
            f"{prefix}.gate_up_proj", (count, 2 * gate[0], gate[1]),
            tuple((experts[e]["gate_proj"], experts[e]["up_proj"]) for e in range(count)))
        stacked[f"{prefix}.down_proj"] = StackedTensor(
            f"{prefix}.down_proj", (count, down[0], down[1]),
            tuple((experts[e]["down_proj"],) for e in range(count)))
    return stacked


def _shape2(shapes: dict[str, tuple[int, ...]], name: str, label: str) -> tuple[int, int]:
    shape = tuple(shapes[name])
    if len(shape) != 2:
        raise WeightsError(f"{label}: tensor {name!r} has shape {list(shape)}, expected a matrix")
    return shape[0], shape[1]


def load_stacked(tensor: StackedTensor, read: Callable[[str], torch.Tensor], device: torch.device,
                 dtype: torch.dtype) -> torch.Tensor:
    """Assemble ``tensor`` ``(E, out, in)`` on ``device``; ``read(name)`` returns one source matrix."""
    out = torch.empty(tensor.shape, dtype=dtype, device=device)
    for e, names in enumerate(tensor.parts):
        row = 0
        for name in names:
            part = read(name)  # (rows, in)
            out[e, row : row + part.shape[0]].copy_(part)
            row += part.shape[0]
    return out
