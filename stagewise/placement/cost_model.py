"""Cost model: predicted seconds per token of each stage and each handoff.

Decode, per token: a stage reads its active weights and its KV cache at the profile's full
context (bytes / memory bandwidth), does its FLOPs (/ matmul rate) and launches its kernels
(count x the device's per-kernel time, measured); a handoff moves one
hidden state (latency + bytes / bandwidth). Stage cost is a sum of per-block costs, each
rounded to integer picoseconds, so the planner's sums are exact and ties are real ties.
Prefill, per token and block: the slower of reading its weights once per chunk (an MoE block: the
experts a chunk's tokens route to, all of them for long chunks) and its FLOPs (attention over half
the context on average) at the share of the matmul rate its GEMMs reach, plus a Gated DeltaNet
block's chunked scan (in proportion to its recurrent state); on a CPU a chunk also takes at least its
operation count x the host's time per operation (issued eagerly). The shares and the scan's time are
fitted on an H200 (build J).
"""

from __future__ import annotations

from stagewise.hardware.defaults import HOST_OP_S, kernel_overhead_s
from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.kernel_counts import block_prefill_ops
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.state_bytes import kv_context_bytes

PS_PER_S = 10**12
# Prefill, fitted on an H200 (bench/results, build J) against its measured rates (790 TFLOP/s bf16,
# 4.21 TB/s: ../shared/reference/topologies/2xh200-nvlink.json, `stagewise devices --measure`):
PREFILL_DENSE_EFFICIENCY = 0.71  # Llama-3.1-8B, 2,048 tokens in one chunk: 38.5k tok/s
PREFILL_MOE_EFFICIENCY = 0.23  # grouped expert GEMMs, Q8_0: Qwen3-30B-A3B, one 2,048-token chunk: 28.2k tok/s
# ... at 128 tokens per expert (2,048 x 8 / 128); fewer tokens per expert make smaller GEMMs: the share
# falls as (tokens / 128) ** 0.34 (Qwen3-30B-A3B, one 512-token chunk: 19.6k tok/s, 32 per expert)
MOE_FULL_TOKENS_PER_EXPERT = 128
MOE_EFFICIENCY_EXPONENT = 0.34
# a Gated DeltaNet block's chunked scan and gating per prompt token, scaled by matmul rate and by the block's
# recurrent state (value heads x key dim x value dim: the scan's work per token grows with it)
# (Qwen3.6-35B-A3B Q8_0 on one H200, 512-token chunks: 7.8k tok/s)
LINEAR_ATTENTION_PREFILL_S = 2.4e-6
LINEAR_ATTENTION_REFERENCE_FLOPS_PER_S = 790e12
LINEAR_ATTENTION_REFERENCE_STATE_VALUES = 32 * 128 * 128  # Qwen3.6-35B-A3B's (and Qwen3.5-4B's) state a block
OBJECTIVES = ("latency", "throughput")


def _ps(seconds: float) -> int:
    return round(seconds * PS_PER_S)


def block_decode_ps(block: BlockSpec, device: DeviceInfo, profile: Profile) -> int:
    """Picoseconds block ``block`` adds to one decode step on ``device``."""
    kv_read = kv_context_bytes(block, profile)  # decode reads the whole cache
    flops = profile.batch * (block.flops_per_token + block.attention_flops_per_position * profile.context_tokens)
    return _ps(
        (block.read_bytes_per_token + kv_read) / device.memory_bandwidth_bytes_per_s
        + flops / device.matmul_flops_per_s
        + block.kernels_per_token * kernel_overhead_s(device.kind)  # launches, not bytes
    )


def end_decode_ps(end: EndSpec, device: DeviceInfo, profile: Profile) -> int:
    """Picoseconds the entry or exit adds to one decode step on ``device``."""
    return _ps(
        end.read_bytes_per_token / device.memory_bandwidth_bytes_per_s
        + profile.batch * end.flops_per_token / device.matmul_flops_per_s
        + end.kernels_per_token * kernel_overhead_s(device.kind)
    )


def handoff_ps(spec: ModelSpec, profile: Profile, link: Link) -> int:
    """Picoseconds to hand one decode step's hidden states across ``link``."""
    return _ps(link.transfer_s(profile.batch * spec.handoff_bytes_per_token(profile)))


def stage_decode_ps(
    spec: ModelSpec, profile: Profile, device: DeviceInfo, start: int, end: int, entry: bool, exit: bool
) -> int:
    """Decode picoseconds of a stage: the sum of its blocks' and ends' costs."""
    total = sum(block_decode_ps(b, device, profile) for b in spec.blocks[start:end])
    if entry:
        total += end_decode_ps(spec.entry, device, profile)
    if exit:
        total += end_decode_ps(spec.exit, device, profile)
    return total


def chunk_read_bytes(block: BlockSpec, chunk_tokens: int) -> float:
    """Weight bytes a prefill chunk of ``chunk_tokens`` reads for ``block``: all of a dense block; for
    an MoE block the shared part and the experts its tokens route to (expected number under uniform
    routing: ``E * (1 - (1 - k/E) ** tokens)``)."""
    experts, k = block.routed_experts, block.experts_per_token
    if experts <= k or k <= 0:
        return float(block.read_bytes_per_token)
    expert_bytes = (block.weight_bytes - block.read_bytes_per_token) / (experts - k)
    shared = block.read_bytes_per_token - k * expert_bytes
    touched = experts * (1.0 - (1.0 - k / experts) ** chunk_tokens)
    return shared + touched * expert_bytes


def block_prefill_s_per_token(block: BlockSpec, profile: Profile, device: DeviceInfo) -> float:
    """Device seconds per prompt token of one block during prefill (module note)."""
    read_s = chunk_read_bytes(block, profile.chunk_tokens) / profile.chunk_tokens / device.memory_bandwidth_bytes_per_s
    flops = block.flops_per_token + block.attention_flops_per_position * profile.context_tokens / 2
    share = PREFILL_DENSE_EFFICIENCY
    if block.routed_experts > 0:
        per_expert = profile.chunk_tokens * max(block.experts_per_token, 1) / block.routed_experts
        share = PREFILL_MOE_EFFICIENCY * min(1.0, per_expert / MOE_FULL_TOKENS_PER_EXPERT) ** MOE_EFFICIENCY_EXPONENT
    seconds = max(read_s, flops / (device.matmul_flops_per_s * share))
    if block.mixer == "linear_attention":
        state = block.recurrent_state_values / LINEAR_ATTENTION_REFERENCE_STATE_VALUES
        seconds += LINEAR_ATTENTION_PREFILL_S * state * LINEAR_ATTENTION_REFERENCE_FLOPS_PER_S / device.matmul_flops_per_s
    return seconds


def stage_prefill_s_per_token(
    spec: ModelSpec, profile: Profile, device: DeviceInfo, start: int, end: int, exit: bool
) -> float:
    """Seconds per prompt token of a stage during prefill (weights read once per chunk)."""
    blocks = spec.blocks[start:end]
    device_s = sum(block_prefill_s_per_token(b, profile, device) for b in blocks)
    if exit:  # the LM head is read once per chunk for the logits of the last token only
        device_s += (spec.exit.read_bytes_per_token / device.memory_bandwidth_bytes_per_s
                     + spec.exit.flops_per_token / device.matmul_flops_per_s) / profile.chunk_tokens
    if device.kind != "cpu":
        return device_s  # a GPU stage replays a full chunk as one CUDA graph: the host issues nothing per op
    # eagerly, the host issues a chunk's operations one by one; the device cannot run ahead of that
    ops = sum(block_prefill_ops(b.kernels_per_token, b.mixer, b.routed_experts > 0, profile.chunk_tokens)
              for b in blocks)
    host_s = ops * HOST_OP_S / profile.chunk_tokens
    return max(device_s, host_s)


def pipelined_prefill_s_per_token(stage_s: list[float], handoff_s: float, chunks: int) -> float:
    """Seconds per prompt token when a prompt of ``chunks`` chunks flows through the stages: the first
    chunk crosses every stage, each further one leaves the slowest stage one chunk-time later."""
    if chunks <= 1 or len(stage_s) == 1:
        return sum(stage_s) + handoff_s
    return (sum(stage_s) + handoff_s + (chunks - 1) * max(stage_s)) / chunks


def objective_key(
    objective: str, stage_ps: list[int], handoff_out_ps: list[int], use_ppm: list[int]
) -> tuple[int, int]:
    """(primary, secondary) to minimize. latency: (sum of stages + handoffs, highest budget
    use in ppm); throughput: (slowest stage incl. its outgoing handoff, sum)."""
    total = sum(stage_ps) + sum(handoff_out_ps)
    if objective == "latency":
        return (total, max(use_ppm))
    return (max(s + h for s, h in zip(stage_ps, handoff_out_ps, strict=True)), total)
