"""Assumed figures used when nothing better is known (documented in docs/accounting.md).

Datasheet-class leads, deliberately modest: a measured figure (``stagewise devices --measure``)
or a topology file always wins over these.
"""

from __future__ import annotations

# Simulated devices (``--devices 24GiB,12GiB``): an RTX 3090-class GPU.
SIM_MEMORY_BANDWIDTH_BYTES_PER_S = 900e9
SIM_MATMUL_FLOPS_PER_S = 70e12

# Real GPUs whose datasheet we do not know (``cuda:0@22GB`` parsed without CUDA present).
GPU_MEMORY_BANDWIDTH_BYTES_PER_S = 900e9
GPU_MATMUL_FLOPS_PER_S = 70e12

# CPU devices (real or virtual): a desktop's dual-channel DDR and a few AVX cores.
CPU_MEMORY_BANDWIDTH_BYTES_PER_S = 40e9
CPU_MATMUL_FLOPS_PER_S = 0.5e12

# Links that a topology does not list.
HOST_STAGED_BANDWIDTH_BYTES_PER_S = 12e9  # PCIe 4.0 x16 through pinned host memory
HOST_STAGED_LATENCY_S = 40e-6  # the RFC measured 38.4 us for a decode handoff
NETWORK_BANDWIDTH_BYTES_PER_S = 1.25e9  # 10 GbE
NETWORK_LATENCY_S = 100e-6
SAME_DEVICE_LATENCY_S = 1e-6  # virtual devices sharing one torch device: a local copy

# NVLink per-link bandwidth by generation is not discoverable portably; one NVLink 3 lane.
NVLINK_BANDWIDTH_PER_LINK_BYTES_PER_S = 25e9
NVLINK_LATENCY_S = 10e-6
PCIE_P2P_BANDWIDTH_BYTES_PER_S = 20e9
PCIE_P2P_LATENCY_S = 15e-6

# Datasheet leads for GPUs discovery recognizes by name (memory bandwidth bytes/s, dense bf16
# FLOP/s). Longest matching name fragment wins; `devices --measure` replaces them.
GPU_DATASHEET: dict[str, tuple[float, float]] = {
    "H200": (4.8e12, 989e12),
    "H100": (3.35e12, 989e12),
    "A100": (2.0e12, 312e12),
    "L40S": (864e9, 362e12),
    "RTX 6000 Ada": (960e9, 364e12),
    "A6000": (768e9, 155e12),
    "RTX 4090": (1008e9, 165e12),
    "RTX 3090": (936e9, 71e12),
    "RTX 3060": (360e9, 25e12),
}


def assumed_speeds(kind: str) -> tuple[float, float]:
    """(memory bandwidth bytes/s, matmul FLOP/s) assumed for a device of ``kind`` nothing else describes."""
    if kind == "cpu":
        return CPU_MEMORY_BANDWIDTH_BYTES_PER_S, CPU_MATMUL_FLOPS_PER_S
    return GPU_MEMORY_BANDWIDTH_BYTES_PER_S, GPU_MATMUL_FLOPS_PER_S


def gpu_datasheet(name: str) -> tuple[float, float]:
    """(memory bandwidth bytes/s, matmul FLOP/s) for a GPU name, or the generic GPU defaults."""
    matches = [key for key in GPU_DATASHEET if key.lower() in name.lower()]
    if not matches:
        return GPU_MEMORY_BANDWIDTH_BYTES_PER_S, GPU_MATMUL_FLOPS_PER_S
    return GPU_DATASHEET[max(matches, key=len)]


# Fixed time per kernel of a decode step, on top of the bytes it moves at the datasheet bandwidth,
# fitted on an H200 with CUDA-graph decode, the fused kernels and dependent launch (bench/results,
# build J): Llama-3.1-8B 4.16 ms = 3.13 ms of reads + 325 kernels x 3.2 us; Qwen3-30B-A3B Q8_0
# 2.43 ms = 0.68 ms + 725 x 2.4 us; Qwen3.6-35B-A3B Q8_0 2.43 ms = 0.67 ms + 745 x 2.4 us (build D:
# 3.4-5.1 us). The term also absorbs GEMVs running below the bandwidth. CPU: each counted kernel is
# several eager torch ops, issued by the host (HOST_OP_S).
# Host time per counted kernel of an eager (not graph-replayed) step on a CPU, fitted on the 2-core CI
# machine: decode steps of the tiny presets at context 256 (`stagewise bench random:PRESET --devices
# cpu:1x64MiB --prompt 16 --gen 64 --context 256`, 2026-12-07): tiny-llama 1.25 ms / 35 kernels = 36 us,
# tiny-qwen3 53 us, tiny-qwen3-moe 37 us, tiny-qwen3.6 61 us (a Gated DeltaNet block is more ops a kernel).
# A faster host issues faster: predictions on a CPU are this machine's.
HOST_OP_S = 45e-6
KERNEL_OVERHEAD_S = {"cpu": HOST_OP_S}
GPU_KERNEL_OVERHEAD_S = 2.6e-6


def kernel_overhead_s(kind: str) -> float:
    """Seconds one kernel of a decode step costs beyond its bytes, by device kind."""
    return KERNEL_OVERHEAD_S.get(kind, GPU_KERNEL_OVERHEAD_S)

