"""Kernels one decode step launches, per block kind, in stagewise's own implementation.

Decode on a GPU is as much a matter of launches as of bytes: each kernel (even replayed from a
CUDA graph) costs a few microseconds, and a 2,048-wide block launches dozens. The counts are the
kernels of one block's decode step on the GPU path, fused Triton kernels included
(``bench/count_kernels.py`` counts torch operations and Triton launches); keep them in step with
the model code. ``STAGEWISE_KERNELS=torch`` (the unfused reference path) launches about 2-3x as many. The cost model multiplies them by
the device's per-kernel time (:data:`stagewise.hardware.defaults.KERNEL_OVERHEAD_S`).
"""

from __future__ import annotations

from stagewise.spec.model_config import ModelConfig

# mixer, with both norms and the attention's residual add (the MLP's last launch adds the other):
# norm, q/k/v, rotary q and k (after their per-head RMSNorm where the model has one) + cache write,
# attention over key slices, slice combine (with the hybrids' sigmoid output gate), output, add + norm
ATTENTION_KERNELS = 7
# Gated DeltaNet: norm, fused input projection, conv step, delta step, gated norm, output, add + norm
LINEAR_ATTENTION_KERNELS = 7
# MLP
DENSE_MLP_KERNELS = 3  # gate_up, silu * up, down (+ the residual)
MOE_KERNELS = 6  # router, route (softmax + top-k), gathered gate_up, silu * up, gathered down, weighted combine (+ the residual)
# gate_up, silu * up, down: its gate logit is a row of the router's matmul, its gated add part of the combine
SHARED_EXPERT_KERNELS = 3
EXIT_KERNELS = 4  # final norm, LM head, float logits, sampling
ENTRY_KERNELS = 1  # embedding lookup


def block_kernels(c: ModelConfig, index: int) -> int:
    """Kernels of block ``index`` per decode step."""
    if c.block_is_linear(index):
        mixer = LINEAR_ATTENTION_KERNELS
    else:
        mixer = ATTENTION_KERNELS
    if c.block_is_moe(index):
        mlp = MOE_KERNELS + (SHARED_EXPERT_KERNELS if c.shared_expert_intermediate_size else 0)
    else:
        mlp = DENSE_MLP_KERNELS
    return mixer + mlp


# Prefill runs eagerly: the host issues every operation, so a chunk costs at least its operation
# count x the host's time per operation (measured: transformers' eager decode of Llama-3.1-8B on
# the H200 host, ~1,500 operations in 21.8 ms, bench/results/bench_llama8b_1gpu_vs_transformers.json).
GROUPED_MOE_PREFILL_OPS = 26  # per MoE block and chunk: device-side alignment (~20), two grouped GEMMs, SiLU*up, sum
LINEAR_ATTENTION_CHUNK_TOKENS = 64  # the chunked delta rule's chunk
LINEAR_ATTENTION_OPS_PER_CHUNK = 30


def block_prefill_ops(kernels_per_token: int, mixer: str, moe: bool, chunk_tokens: int) -> int:
    """Operations the host issues for one block over a prefill chunk of ``chunk_tokens``.

    MoE blocks count the grouped GEMM path's launches (packed stacks take kernel B's blocks, two launches
    fewer): a fixed count, whatever the routing."""
    ops = kernels_per_token
    if moe:
        ops += GROUPED_MOE_PREFILL_OPS
    if mixer == "linear_attention":
        ops += -(-chunk_tokens // LINEAR_ATTENTION_CHUNK_TOKENS) * LINEAR_ATTENTION_OPS_PER_CHUNK
    return ops
