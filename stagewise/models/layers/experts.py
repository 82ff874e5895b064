"""Experts: a MoE layer's SwiGLU experts as stacked 3-D weights (transformers 5.x layout).

Parameters (checkpoint names under ``mlp.experts.``):
- ``gate_up_proj`` ``(E, 2 * I, H)``: per expert, the gate rows then the up rows;
- ``down_proj`` ``(E, H, I)``.
Checkpoints that store per-expert matrices (``mlp.experts.<e>.gate_proj.weight`` …) are stacked
into this layout by :mod:`stagewise.weights.expert_stacking`. Either weight may instead be resident
packed (:class:`~stagewise.models.layers.quantized_experts.QuantizedExperts`).

Paths (chosen by the slot count and :func:`~stagewise.kernels.triton_launch.use_triton` only):
at most ``GATHER_MAX_SLOTS`` routed slots (decode) gather the routed experts; more slots on the
Triton path with dense or Q8_0 weights run the grouped GEMM
(:mod:`stagewise.kernels.moe_experts`: a fixed number of launches, no host sync); otherwise
(CPU, ``STAGEWISE_KERNELS=torch``, packed formats the grouped GEMM does not read) one matmul pair per used expert.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.quantized_experts import QuantizedExperts

_NAMES = ("gate_up_proj", "down_proj")
GATHER_MAX_SLOTS = 64  # routed (token, expert) pairs up to which decode gathers experts instead of looping


class Experts(nn.Module):
    """``E`` SwiGLU experts applied to the tokens routed to them."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_up_proj: nn.Parameter | None = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj: nn.Parameter | None = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.quantized: dict[str, QuantizedExperts] = {}

    def set_quantized_param(self, name: str, qweight: QuantizedExperts, dtype: torch.dtype | None = None) -> None:
        """Loader hook: stacked weight ``name`` (``gate_up_proj`` or ``down_proj``) arrives packed
        (``dtype`` unused: outputs take the activation's dtype)."""
        if name not in _NAMES:
            raise ValueError(f"Experts cannot hold {name!r} quantized")
        dense = getattr(self, name)
        want = tuple(dense.shape) if dense is not None else None
        if want is not None and tuple(qweight.shape) != want:
            raise ValueError(f"quantized {name} shape {tuple(qweight.shape)} != {want}")
        setattr(self, name, None)  # drop the dense parameter: no dequantized copy is kept
        self.quantized[name] = qweight

    def quantized_weights(self) -> list[QuantizedExperts]:
        return list(self.quantized.values())

    def _matmul(self, name: str, expert: int, x: torch.Tensor) -> torch.Tensor:
        packed = self.quantized.get(name)
        if packed is not None:
            return packed.expert(expert).matmul(x)
        weight = getattr(self, name)
        return nn.functional.linear(x, weight[expert])

    def forward(self, x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor,
                residual: torch.Tensor | None = None,
                shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` ``(N, H)``; ``top_index``/``top_weight`` ``(N, K)``: each token's experts and weights.

        Returns ``sum_k top_weight[n, k] * expert_{top_index[n, k]}(x[n])`` ``(N, H)``; with ``shared`` (Triton
        path: a shared expert's output ``(N, H)`` and gate logit ``(N, 1)``) then ``+ sigmoid(g) * shared``
        (:func:`~stagewise.kernels.moe_route_triton.add_gated_shared`'s rounding); plus ``residual`` ``(N, H)``
        when given. The decode paths' last launch (the combine) adds both, other paths a launch after.
        """
        if self._gathers(top_index.numel(), use_triton(x)):
            return self._gathered(x, top_index, top_weight, residual, shared)
        return self._routed(x, top_index, top_weight, residual, shared)

    def _gathers(self, slots: int, triton: bool) -> bool:
        """Whether a step of ``slots`` routed pairs gathers its experts: few slots, or, on the Triton
        path, packed stacks the grouped GEMM cannot read (the per-expert loop reads the routed counts on
        the host, which a captured step cannot do)."""
        return slots <= GATHER_MAX_SLOTS or (triton and any(not q.supports_grouped for q in self.quantized.values()))

    def _routed(self, x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor,
                residual: torch.Tensor | None = None,
                shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Prefill and batched decode: each expert's tokens together (the grouped GEMM, or a loop over
        the used experts); ``residual`` added as a separate add would."""
        if use_triton(x):
            gate_up, down = self._grouped_weight("gate_up_proj"), self._grouped_weight("down_proj")
            if gate_up is not None and down is not None:
                from stagewise.kernels.moe_experts import grouped_swiglu_experts

                return grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,  # type: ignore[arg-type]
                                              residual=residual, shared=shared)  # a stack the kernel reads
        if shared is not None:  # the loop below, then the shared expert and the residual in one launch
            from stagewise.kernels.moe_route_triton import add_gated_shared

            return add_gated_shared(self._routed(x, top_index, top_weight), *shared, residual)
        tokens, k = top_index.shape
        flat = top_index.reshape(-1)  # (N*K,) routed (token, slot) pairs
        order = torch.argsort(flat, stable=True)  # grouped by expert
        # NOTE: one host read per MoE layer (the routed counts), then one matmul pair per used expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        xs = x.index_select(0, order // k)  # (N*K, H) sorted by expert
        ys = torch.empty_like(xs)
        lo = 0
        for expert, count in enumerate(counts):
            if count:
                gate, up = self._matmul("gate_up_proj", expert, xs[lo : lo + count]).chunk(2, dim=-1)  # (n_e, I)
                ys[lo : lo + count] = self._matmul("down_proj", expert, nn.functional.silu(gate) * up)  # (n_e, H)
                lo += count
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        y = ys.index_select(0, inverse).view(tokens, k, -1)  # (N, K, H) back in slot order
        out = (y * top_weight[..., None]).sum(dim=1).to(x.dtype)  # a fixed-order sum: deterministic
        return out if residual is None else out + residual

    def launch_classes(self, slots: int, device: torch.device) -> tuple[object, ...]:
        """What Triton specializes on in a step of ``slots`` routed (token, expert) pairs on ``device``'s
        Triton path and only the slot count decides (:func:`~stagewise.kernels.moe_experts.launch_classes`):
        equal classes, the same compiled kernels (warm-up runs one step of each)."""
        from stagewise.kernels.kernel_variants import int_class

        if self._gathers(slots, triton=True):
            return ("gathered", int_class(slots))
        from stagewise.kernels.moe_experts import launch_classes

        gate_up, down = self._grouped_weight("gate_up_proj"), self._grouped_weight("down_proj")
        return ("grouped", *launch_classes(slots, gate_up, down, device))  # type: ignore[arg-type]

    def _grouped_weight(self, name: str) -> torch.Tensor | QuantizedExperts | None:
        """The stack the grouped GEMM reads, or None for a packed format it does not know."""
        packed = self.quantized.get(name)
        if packed is None:
            return getattr(self, name)
        return packed if packed.supports_grouped else None

    def _gathered(self, x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor,
                  residual: torch.Tensor | None = None,
                  shared: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Decode path: gather the routed experts' weights (only those are read); no host sync.
        ``residual`` (and ``shared``) are added by the combine kernel on the Triton path, by a separate add
        otherwise."""
        tokens, k = top_index.shape
        index = top_index.reshape(-1)  # (N*K,)
        if use_triton(x):  # 4 launches: the token rows are read in place, K slots each
            from stagewise.kernels.moe_route_triton import combine
            from stagewise.kernels.silu_mul_triton import silu_mul

            routes = self._routing(index)  # the slots sorted once for both stacks (a packed one's blocks)
            act = silu_mul(self._gather_matmul("gate_up_proj", index, x, k, routes))  # (N*K, I)
            return combine(self._gather_matmul("down_proj", index, act, 1, routes), top_weight, x.dtype, residual,
                           shared)  # (N, H)
        if shared is not None:
            raise ValueError("a shared expert is added inside the experts on the Triton path only")
        xs = x.repeat_interleave(k, dim=0)  # (N*K, H)
        gate, up = self._gather_matmul("gate_up_proj", index, xs, 1).chunk(2, dim=-1)  # (N*K, I) each
        y = self._gather_matmul("down_proj", index, nn.functional.silu(gate) * up, 1)  # (N*K, H)
        out = (y.view(tokens, k, -1) * top_weight[..., None]).sum(dim=1).to(x.dtype)  # (N, H)
        return out if residual is None else out + residual

    def _routing(self, index: torch.Tensor) -> object | None:
        """The routed slots' sorting that both stacks read (the gate/up stack's :meth:`QuantizedExperts.routing`,
        a function of the slots and the expert count only: a down stack that sorts its slots reads the same; one
        that sorts none ignores it), or None."""
        gate_up = self.quantized.get("gate_up_proj")
        return gate_up.routing(index) if gate_up is not None else None

    def _gather_matmul(self, name: str, index: torch.Tensor, xs: torch.Tensor, x_repeat: int,
                       routes: object | None = None) -> torch.Tensor:
        """Slot ``m``: expert ``index[m]`` of weight ``name`` times row ``m // x_repeat`` of ``xs`` (``routes``: the
        stacks' shared :meth:`_routing`)."""
        packed = self.quantized.get(name)
        if packed is not None:
            return packed.gather_matmul(index, xs, x_repeat, routes)
        weight = getattr(self, name)  # (E, out, in)
        if use_triton(xs) and weight.dtype == xs.dtype:
            from stagewise.kernels.gemv_triton import gemv

            return gemv(xs, weight, index, x_repeat=x_repeat)  # reads only the routed experts, one launch
        if x_repeat > 1:
            xs = xs.repeat_interleave(x_repeat, dim=0)  # (N*K, in)
        return torch.bmm(weight.index_select(0, index), xs[:, :, None]).squeeze(-1)  # (N*K, out)

    def extra_repr(self) -> str:
        formats = {n: (self.quantized[n].format_name if n in self.quantized else "dense") for n in _NAMES}
        return (f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.intermediate_size}, "
                f"format={formats}")
