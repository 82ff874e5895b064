"""Cost model: predicted seconds per token of each stage and each handoff.

Decode, per token: a stage reads its active weights and its KV cache at the profile's full
context (bytes / memory bandwidth), does its FLOPs (/ matmul rate) and launches its kernels
(count x the device's per-kernel time, measured); a handoff moves one
hidden state (latency + bytes / bandwidth). Stage cost is a sum of per-block costs, each
rounded to integer picoseconds, so the planner's sums are exact and ties are real ties.
Prefill, per token: weights are read once per chunk, FLOPs include attention over half the
context on average; a chunk also takes at least its operation count x the host's time per
operation (prefill is issued eagerly; MoE blocks issue a few operations per expert used).
"""

from __future__ import annotations

from stagewise.hardware.defaults import HOST_OP_S, kernel_overhead_s
from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.kernel_counts import block_prefill_ops
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile
from stagewise.spec.state_bytes import kv_cache_bytes

PS_PER_S = 10**12
PREFILL_DEVICE_EFFICIENCY = 0.65  # share of matmul peak prefill GEMMs reach (measured ~0.6-0.7 on an H200)
OBJECTIVES = ("latency", "throughput")


def _ps(seconds: float) -> int:
    return round(seconds * PS_PER_S)


def block_decode_ps(block: BlockSpec, device: DeviceInfo, profile: Profile) -> int:
    """Picoseconds block ``block`` adds to one decode step on ``device``."""
    kv_read = kv_cache_bytes(block, profile)  # decode reads the whole cache
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


def stage_prefill_s_per_token(
    spec: ModelSpec, profile: Profile, device: DeviceInfo, start: int, end: int, exit: bool
) -> float:
    """Seconds per prompt token of a stage during prefill (weights read once per chunk)."""
    blocks = spec.blocks[start:end]
    read = sum(b.read_bytes_per_token for b in blocks) + (spec.exit.read_bytes_per_token if exit else 0)
    mean_context = profile.context_tokens / 2
    flops = sum(b.flops_per_token + b.attention_flops_per_position * mean_context for b in blocks)
    flops += spec.exit.flops_per_token / profile.chunk_tokens if exit else 0  # logits of the last token only
    device_s = (read / profile.chunk_tokens / device.memory_bandwidth_bytes_per_s
                + flops / device.matmul_flops_per_s) / PREFILL_DEVICE_EFFICIENCY
    if device.kind != "cpu":
        return device_s  # a GPU stage replays a full chunk as one CUDA graph: the host issues nothing per op
    # eagerly, the host issues a chunk's operations one by one; the device cannot run ahead of that
    ops = sum(block_prefill_ops(b.kernels_per_token, b.mixer, b.routed_experts > 0, profile.chunk_tokens)
              for b in blocks)
    host_s = ops * HOST_OP_S / profile.chunk_tokens
    return max(device_s, host_s)


def objective_key(
    objective: str, stage_ps: list[int], handoff_out_ps: list[int], use_ppm: list[int]
) -> tuple[int, int]:
    """(primary, secondary) to minimize. latency: (sum of stages + handoffs, highest budget
    use in ppm); throughput: (slowest stage incl. its outgoing handoff, sum)."""
    total = sum(stage_ps) + sum(handoff_out_ps)
    if objective == "latency":
        return (total, max(use_ppm))
    return (max(s + h for s, h in zip(stage_ps, handoff_out_ps, strict=True)), total)
