"""Sparse MoE MLP: softmax top-k router, stacked SwiGLU experts, optional sigmoid-gated shared expert.

Qwen3-MoE has no shared expert; Qwen3-Next and Qwen3.5-MoE add one whose output is scaled by
``sigmoid(shared_expert_gate(x))``. Checkpoint names: ``gate`` (router), ``experts``,
``shared_expert``, ``shared_expert_gate``.
"""

from __future__ import annotations

import torch
from torch import nn

from stagewise.kernels.triton_launch import use_triton
from stagewise.models.layers.experts import Experts
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

    def launch_classes(self, tokens: int, device: torch.device) -> tuple[object, ...]:
        """What Triton specializes on in this layer's experts for a step of ``tokens`` tokens on ``device``
        (:meth:`Experts.launch_classes` of its routed slots)."""
        return self.experts.launch_classes(tokens * self.top_k, device)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k expert indices ``(N, K)`` and their weights ``(N, K)`` in ``x``'s dtype."""
        logits = self.gate(x)  # (N, E)
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
        top_index, top_weight = self.route(flat)
        if self.shared_expert is None or self.shared_expert_gate is None:
            return self.experts(flat, top_index, top_weight, rows).reshape(shape)
        out = self.experts(flat, top_index, top_weight)
        if use_triton(out):
            from stagewise.kernels.moe_route_triton import add_gated_shared

            return add_gated_shared(out, self.shared_expert(flat), self.shared_expert_gate(flat), rows).reshape(shape)
        out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return (out if rows is None else out + rows).reshape(shape)
