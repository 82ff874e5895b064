"""ModelSpec: a model as the planner sees it — blocks with costs, plus entry and exit.

Built from a :class:`ModelConfig` and a stored format (:meth:`ModelSpec.from_config`) or, by
the GGUF reader, with exact per-block bytes (``tensor_bytes_by_block``). No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stagewise.errors import ConfigError
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.profile import Profile
from stagewise.spec.weight_bytes import Expansion


@dataclass(frozen=True)
class ModelSpec:
    """Blocks ``0..num_blocks`` (indexed globally), entry and exit, in stored format ``format``."""

    name: str
    architecture: str
    format: str
    hidden_size: int
    vocab_size: int
    blocks: tuple[BlockSpec, ...]
    entry: EndSpec
    exit: EndSpec
    expanded: tuple[Expansion, ...] = ()  # tensors dequantized at load (expanded IQ types), by type
    max_context_tokens: int = 0  # the model's max_position_embeddings (0: not known)
    stage_table_bytes: int = 0  # tables every stage keeps whatever its blocks (the rotary frequencies)

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ConfigError(f"model {self.name!r}: no blocks")
        for position, block in enumerate(self.blocks):
            if block.index != position:
                raise ConfigError(f"model {self.name!r}: block at position {position} has index {block.index}")
        if self.max_context_tokens < 0 or self.stage_table_bytes < 0:
            raise ConfigError(f"model {self.name!r}: max_context_tokens and stage_table_bytes must be >= 0")
        if self.hidden_size <= 0 or self.vocab_size <= 0:
            raise ConfigError(f"model {self.name!r}: hidden_size and vocab_size must be positive")

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def weight_bytes(self) -> int:
        """Resident weights of the whole model on one device (a tied head counted once, the stage's
        tables once)."""
        blocks = sum(b.weight_bytes for b in self.blocks)
        return (self.entry.weight_bytes + blocks + self.exit.weight_bytes - self.exit.shared_bytes
                + self.stage_table_bytes)

    def handoff_bytes_per_token(self, profile: Profile) -> int:
        """Bytes of hidden activation one token moves across a stage boundary."""
        return self.hidden_size * profile.activation_bytes

    @staticmethod
    def from_config(
        config: ModelConfig,
        fmt: str = "bf16",
        name: str = "",
        tensor_bytes_by_block: Mapping[int, int] | None = None,
        entry_bytes: int | None = None,
        exit_bytes: int | None = None,
    ) -> ModelSpec:
        """Build the spec of ``config`` stored in ``fmt`` (``bf16``, ``q8_0``, ``q4_k``, …).

        ``tensor_bytes_by_block`` / ``entry_bytes`` / ``exit_bytes``: exact resident bytes
        (e.g. summed from a GGUF's tensor infos) replacing the estimates; bytes read per
        token scale with them.
        """
        from stagewise.spec.spec_builder import build_spec

        return build_spec(config, fmt, name, tensor_bytes_by_block, entry_bytes, exit_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "architecture": self.architecture,
            "format": self.format,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "blocks": [b.to_dict() for b in self.blocks],
            "entry": self.entry.to_dict(),
            "exit": self.exit.to_dict(),
            "max_context_tokens": self.max_context_tokens,
            "stage_table_bytes": self.stage_table_bytes,
        }
