"""Sparse MoE MLP: softmax top-k router, stacked SwiGLU experts, optional sigmoid-gated shared expert.

Qwen3-MoE has no shared expert; Qwen3-Next and Qwen3.5-MoE add one whose output is scaled by
``sigmoid(shared_expert_gate(x))``. Checkpoint names: ``gate`` (router), ``experts``,
``shared_expert``, ``shared_expert_gate``. After loading (:meth:`SparseMoE.fuse`) the shared expert's gate
is one more row of the router's matmul, and on the Triton path the experts' last launch adds the shared
expert's gated output (and the residual) beside the routed sum: two launches fewer a layer.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.experts import Experts
from stagewise.models.layers.fused_linear import fuse_linears
from stagewise.models.layers.linear import Linear
from stagewise.models.layers.swiglu import SwiGLU
from stagewise.spec.model_config import ModelConfig


class SparseMoE(nn.Module):
    """``y = sum_k w_k * expert_k(x) (+ sigmoid(g(x)) * shared(x))`` per token."""

    def __init__(self, config: ModelConfig, shared_expert: bool) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        self.gate = Linear(hidden, config.num_experts)  # router
        self.experts = Experts(config.num_experts, hidden, config.moe_intermediate_size)
        self.shared_expert: SwiGLU | None = None
        self.shared_expert_gate: Linear | None = None
        if shared_expert:
            self.shared_expert = SwiGLU(hidden, config.shared_expert_intermediate_size)
            self.shared_expert_gate = Linear(hidden, 1)
        self.router: Linear | None = None  # gate and shared_expert_gate as one matmul (E + 1 outputs), after fuse()

    def fuse(self) -> None:
        """Run the shared expert's gate logit as one more output of the router's matmul (after loading;
        where the two are stored alike, as GGUF files and the random presets keep them: dense)."""
        if self.shared_expert_gate is not None:
            self.router = fuse_linears([self.gate, self.shared_expert_gate])

    def logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The router's logits ``(N, E)`` and the shared expert's gate logit ``(N, 1)`` (None without a shared
        expert) for ``x`` ``(N, H)``: views of one matmul's output once fused."""
        if self.router is not None:
            both = self.router(x, aligned=True)  # (N, E + 1), rows 16-byte aligned where cuBLAS runs it
            return both[:, :-1], both[:, -1:]
        return self.gate(x), self.shared_expert_gate(x) if self.shared_expert_gate is not None else None

    def launch_classes(self, tokens: int, device: torch.device) -> tuple[object, ...]:
        """What Triton specializes on in this layer's experts for a step of ``tokens`` tokens on ``device``
        (:meth:`Experts.launch_classes` of its routed slots)."""
        return self.experts.launch_classes(tokens * self.top_k, device)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert indices ``(N, K)`` and their weights ``(N, K)`` in the logits' dtype, from the router's
        ``logits`` ``(N, E)``."""
        if use_triton(logits):
            from stagewise.kernels.moe_route_triton import route

            return route(logits, self.top_k, self.norm_topk_prob)  # one launch; indices int32
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        top_weight, top_index = torch.topk(probs, self.top_k, dim=-1)  # (N, K)
        if self.norm_topk_prob:
            top_weight = top_weight / top_weight.sum(dim=-1, keepdim=True)
        return top_index, top_weight.to(logits.dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """The MoE's output, plus ``residual`` (``x``'s shape) when given: on the GPU decode path the
        last launch adds it, with the rounding of a separate add."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, H)
        rows = residual.reshape(flat.shape) if residual is not None else None
        logits, gate_logit = self.logits(flat)
        top_index, top_weight = self.route(logits)
        if self.shared_expert is None or gate_logit is None:
            return self.experts(flat, top_index, top_weight, rows).reshape(shape)
        if use_triton(flat):  # the experts' last launch adds out + sigmoid(g) * shared, then the residual
            shared = (self.shared_expert(flat), gate_logit)
            return self.experts(flat, top_index, top_weight, rows, shared=shared).reshape(shape)
        out = self.experts(flat, top_index, top_weight)
        out = out + torch.sigmoid(gate_logit) * self.shared_expert(flat)
        return (out if rows is None else out + rows).reshape(shape)
