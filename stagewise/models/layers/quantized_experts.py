"""QuantizedExperts: the protocol of a stacked 3-D expert weight resident in a packed format.

A MoE layer's experts are stored stacked, ``(num_experts, out_features, in_features)``, so a GPU
path can gather the routed experts. A packed implementation (e.g. GGUF Q8_0 / K-quants, in
:mod:`stagewise.weights`) hands :class:`~stagewise.models.layers.experts.Experts` one object per
stacked weight through ``set_quantized_param``; the pure-torch path calls
``qweight.expert(e).matmul(x)`` for each routed expert ``e``.
"""

from __future__ import annotations

from typing import Protocol

import torch

from stagewise.models.layers.quantized_weight import QuantizedWeight


class QuantizedExperts(Protocol):
    """A resident quantized stack of expert matrices of logical shape ``(E, out, in)``."""

    format_name: str
    supports_grouped: bool  # the grouped MoE GEMM (prefill, batched decode) can read this stack

    @property
    def shape(self) -> tuple[int, int, int]: ...

    @property
    def nbytes(self) -> int:
        """Resident bytes on the device (all packed buffers together)."""
        ...

    def expert(self, index: int) -> QuantizedWeight:
        """Expert ``index``'s ``(out, in)`` matrix as a 2-D quantized weight (a view: no copy)."""
        ...

    def routing(self, expert_index: torch.Tensor) -> object | None:
        """What :meth:`gather_matmul` sorts the slots ``expert_index (M,)`` into (one-expert blocks), made
        once for a layer's stacks and passed to each as ``routes``; None where it sorts nothing. It depends
        on the slots and the expert count only."""
        ...

    def gather_matmul(self, expert_index: torch.Tensor, x: torch.Tensor, x_repeat: int = 1,
                      routes: object | None = None) -> torch.Tensor:
        """Row ``m // x_repeat`` of ``x`` ``(M / x_repeat, in)`` times expert ``expert_index[m]`` -> ``(M, out)``,
        reading only those experts and without host synchronization; ``routes``: a :meth:`routing` of the
        same slots (None: made here if needed)."""
        ...

    def to(self, device: torch.device) -> QuantizedExperts: ...
