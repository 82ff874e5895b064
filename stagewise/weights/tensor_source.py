"""TensorSource: where a stage's tensors come from (a safetensors directory, a GGUF file, ...).

Names are our parameter names (the Hugging Face checkpoint's); a source translates its own
naming and layout (e.g. GGUF's) behind this interface.
"""

from __future__ import annotations

import math
import re
from typing import Protocol

import torch

from stagewise.models.layers.quantized_weight import QuantizedWeight


class TensorSource(Protocol):
    """A read-only set of named tensors, read one at a time."""

    @property
    def label(self) -> str:
        """The file or directory, for error messages."""
        ...

    def names(self) -> set[str]:
        """Every tensor name this source holds, in our naming."""
        ...

    def shape(self, name: str) -> tuple[int, ...]:
        """The logical (dense) shape of ``name``."""
        ...

    def is_quantized(self, name: str) -> bool:
        """True when ``name`` is stored in a packed format that stays resident packed."""
        ...

    def load(self, name: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``name`` as a dense tensor of ``dtype`` on ``device`` (read straight from the file)."""
        ...

    def load_quantized(self, name: str, device: torch.device) -> QuantizedWeight:
        """``name`` in its packed resident form on ``device``."""
        ...

    def ignored(self) -> set[str]:
        """Names present in the file that are knowingly not executed (MTP, vision tower)."""
        ...


_BLOCK = re.compile(r"^model\.layers\.(\d+)\.")


def block_index(name: str) -> int | None:
    """The global block a tensor name belongs to (``model.layers.<i>.…``), or None (entry / exit)."""
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else None


def keeps_packed(owner: object, source: TensorSource, name: str) -> bool:
    """The loader's rule: ``name`` stays resident packed when the source stores it packed and the
    module owning it can hold packed weights; anything else is dequantized at load."""
    return hasattr(owner, "set_quantized_param") and source.is_quantized(name)


def resident_bytes(source: TensorSource, name: str, owner: object, dense_bytes: int) -> int:
    """Bytes ``name`` will take on its device: packed as stored, or dense at ``dense_bytes`` per value."""
    if keeps_packed(owner, source, name):
        index = getattr(source, "input_index_elements", None)  # an int64 input gather beside the blocks
        extra = 8 * int(index(name)) if callable(index) else 0
        return int(source.source_bytes(name)) + extra  # type: ignore[attr-defined]  # packed sources report it
    return math.prod(source.shape(name)) * dense_bytes
