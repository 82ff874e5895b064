"""Kernels one decode step launches, per block kind, in stagewise's own implementation.

Decode on a GPU is as much a matter of launches as of bytes: each kernel (even replayed from a
CUDA graph) costs a few microseconds, and a 2,048-wide block launches dozens. The counts are the
non-view operations of one block's decode step (``bench/count_kernels.py`` counts them with a
dispatch-mode counter); keep them in step with the model code. The cost model multiplies them by
the device's per-kernel time (:data:`stagewise.hardware.defaults.KERNEL_OVERHEAD_S`).
"""

from __future__ import annotations

from stagewise.spec.model_config import ModelConfig

# mixer (norm + projections + rotary + cache write + attention + output + residual)
ATTENTION_KERNELS = 33
QK_NORM_KERNELS = 16  # per-head RMSNorm of q and k (Qwen3, hybrids)
OUTPUT_GATE_KERNELS = 12  # the hybrids' sigmoid output gate and zero-centred norms
LINEAR_ATTENTION_KERNELS = 86  # Gated DeltaNet: projections, conv, decay, recurrent step, gated norm
# MLP (norm included in the mixer counts above)
DENSE_MLP_KERNELS = 4  # gate_up, silu, multiply, down
MOE_KERNELS = 16  # router, softmax, top-k, normalization, gathered experts, weighted sum
SHARED_EXPERT_KERNELS = 8  # shared expert and its sigmoid gate
STAGE_KERNELS = 12  # per stage and step: rotary tables and the causal mask (repeated for grouped queries)
EXIT_KERNELS = 10  # final norm, LM head, float logits
ENTRY_KERNELS = 1  # embedding lookup


def block_kernels(c: ModelConfig, index: int) -> int:
    """Kernels of block ``index`` per decode step."""
    if c.block_is_linear(index):
        mixer = LINEAR_ATTENTION_KERNELS
    else:
        mixer = ATTENTION_KERNELS
        if c.architecture != "llama":
            mixer += QK_NORM_KERNELS
        if c.attn_output_gate:
            mixer += OUTPUT_GATE_KERNELS
    if c.block_is_moe(index):
        mlp = MOE_KERNELS + (SHARED_EXPERT_KERNELS if c.shared_expert_intermediate_size else 0)
    else:
        mlp = DENSE_MLP_KERNELS
    return mixer + mlp


# Prefill runs eagerly: the host issues every operation, so a chunk costs at least its operation
# count x the host's time per operation (measured: transformers' eager decode of Llama-3.1-8B on
# the H200 host, ~1,500 operations in 21.8 ms, bench/results/bench_llama8b_1gpu_vs_transformers.json).
EXPERT_PREFILL_OPS = 6  # per expert that receives tokens: slice, two matmuls, activation, multiply, copy
LINEAR_ATTENTION_CHUNK_TOKENS = 64  # the chunked delta rule's chunk
LINEAR_ATTENTION_OPS_PER_CHUNK = 30


def block_prefill_ops(kernels_per_token: int, mixer: str, routed_experts: int, experts_per_token: int,
                      chunk_tokens: int) -> int:
    """Operations the host issues for one block over a prefill chunk of ``chunk_tokens``."""
    ops = kernels_per_token
    if routed_experts:
        ops += min(routed_experts, chunk_tokens * experts_per_token) * EXPERT_PREFILL_OPS
    if mixer == "linear_attention":
        ops += -(-chunk_tokens // LINEAR_ATTENTION_CHUNK_TOKENS) * LINEAR_ATTENTION_OPS_PER_CHUNK
    return ops
