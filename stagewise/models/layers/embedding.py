"""Embedding: token ids -> hidden vectors, the table resident dense or packed.

Dense tables are an ``nn.Parameter`` named ``weight`` ``(vocab, hidden)`` (the checkpoint's name). A
packed table (a GGUF Q4_K / Q6_K / Q8_0 … ``token_embd``) replaces it through
:meth:`Embedding.set_quantized_param`: only the rows of the step's tokens are read and dequantized,
to the run dtype given at load. No dense copy is kept.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class PackedRows(Protocol):
    """What an embedding needs of a packed table: its shape, bytes and a row gather."""

    format_name: str

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def nbytes(self) -> int: ...

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` -> ``(*ids.shape, hidden)`` in ``dtype``."""
        ...


class Embedding(nn.Module):
    """``weight[ids]``, the table dense ``(vocab, hidden)`` or packed."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(num_embeddings, embedding_dim))
        self.quantized: PackedRows | None = None
        self.run_dtype: torch.dtype | None = None

    def set_quantized_param(self, name: str, qweight: PackedRows, dtype: torch.dtype) -> None:
        """Loader hook: ``weight`` arrives packed; rows come out in ``dtype`` (the run dtype)."""
        if name != "weight":
            raise ValueError(f"Embedding cannot hold {name!r} quantized")
        if tuple(qweight.shape) != (self.num_embeddings, self.embedding_dim):
            raise ValueError(f"packed embedding shape {qweight.shape} != {(self.num_embeddings, self.embedding_dim)}")
        self.weight = None
        self.quantized = qweight
        self.run_dtype = dtype

    def quantized_weights(self) -> list[PackedRows]:
        return [self.quantized] if self.quantized is not None else []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            assert self.run_dtype is not None
            return self.quantized.embed(ids, self.run_dtype)  # (..., hidden)
        assert self.weight is not None
        return nn.functional.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        fmt = self.quantized.format_name if self.quantized is not None else "dense"
        return f"{self.num_embeddings}, {self.embedding_dim}, format={fmt}"
