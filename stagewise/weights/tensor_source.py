"""TensorSource: where a stage's tensors come from (a safetensors directory, a GGUF file, ...).

Names are our parameter names (the Hugging Face checkpoint's); a source translates its own
naming and layout (e.g. GGUF's) behind this interface.
"""

from __future__ import annotations

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
