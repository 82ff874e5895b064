"""Discover the devices torch can see: CUDA (torch + NVML), CPU with its RAM, MPS, XPU.

torch and pynvml are imported inside functions so that the rest of ``hardware`` stays
torch-free. Devices come back ordered by PCI bus id (CPU first); links between CUDA devices
carry NVLink counts and peer access from NVML / torch.
"""

from __future__ import annotations

import os
from typing import Any

from stagewise.hardware import defaults
from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.topology import Topology


def discover_topology(reserve: ReservePolicy | None = None) -> Topology:
    """Every device on this machine with live budgets (free memory minus ``reserve``)."""
    policy = reserve or ReservePolicy()
    devices = [cpu_device(policy)]
    links: list[Link] = []
    cuda, cuda_links = _cuda_devices(policy)
    devices += cuda
    links += cuda_links
    devices += _other_devices(policy)
    return Topology(tuple(devices), tuple(links), name="discovered")


def cpu_device(policy: ReservePolicy) -> DeviceInfo:
    total, available = _meminfo()
    return DeviceInfo(
        id="cpu:0",
        host=_hostname(),
        kind="cpu",
        name=_cpu_name(),
        memory_bytes=total,
        budget_bytes=policy.budget_bytes("cpu", total, available),
        memory_bandwidth_bytes_per_s=defaults.CPU_MEMORY_BANDWIDTH_BYTES_PER_S,
        matmul_flops_per_s=defaults.CPU_MATMUL_FLOPS_PER_S,
        torch_device="cpu",
        free_bytes=available,
    )


def driver_version() -> str:
    """NVIDIA driver version via NVML, or ``""`` without one."""
    nvml = _nvml()
    if nvml is None:
        return ""
    try:
        version = nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return ""


def _hostname() -> str:
    return os.uname().nodename or "host0"


def _meminfo() -> tuple[int, int]:
    try:
        fields = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                fields[key] = int(rest.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, KeyError, ValueError, IndexError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _nvml() -> Any:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _cuda_devices(policy: ReservePolicy) -> tuple[list[DeviceInfo], list[Link]]:
    import torch

    if not torch.cuda.is_available():
        return [], []
    nvml = _nvml()
    host = _hostname()
    devices: list[DeviceInfo] = []
    handles: dict[str, Any] = {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        uuid, bus = str(getattr(props, "uuid", "")), ""
        if nvml is not None:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                handles[f"cuda:{index}"] = handle
            except Exception:
                pass
        bandwidth, flops = defaults.gpu_datasheet(props.name)
        devices.append(
            DeviceInfo(
                id=f"cuda:{index}",
                host=host,
                kind="cuda",
                name=props.name,
                memory_bytes=int(total),
                budget_bytes=policy.budget_bytes("cuda", int(total), int(free)),
                memory_bandwidth_bytes_per_s=bandwidth,
                matmul_flops_per_s=flops,
                torch_device=f"cuda:{index}",
                uuid=uuid,
                pci_bus_id=bus.lower(),
                free_bytes=int(free),
            )
        )
    links = []
    for i, a in enumerate(devices):
        for b in devices[i + 1 :]:
            peer = bool(torch.cuda.can_device_access_peer(a.index, b.index))
            nvlinks = _nvlink_count(nvml, handles.get(a.id), b.pci_bus_id) or _nvlink_p2p(
                nvml, handles.get(a.id), handles.get(b.id))
            if nvlinks:
                bw = nvlinks * defaults.NVLINK_BANDWIDTH_PER_LINK_BYTES_PER_S
                links.append(Link(a.id, b.id, "nvlink", bw, defaults.NVLINK_LATENCY_S, peer, nvlinks))
            elif peer:
                bw, lat = defaults.PCIE_P2P_BANDWIDTH_BYTES_PER_S, defaults.PCIE_P2P_LATENCY_S
                links.append(Link(a.id, b.id, "pcie-p2p", bw, lat, True))
            else:
                bw, lat = defaults.HOST_STAGED_BANDWIDTH_BYTES_PER_S, defaults.HOST_STAGED_LATENCY_S
                links.append(Link(a.id, b.id, "pcie-host-staged", bw, lat, False))
    return devices, links


def _nvlink_p2p(nvml: Any, handle: Any, peer: Any) -> int:
    """Active NVLinks of ``handle`` when NVML says the pair talks over NVLink (switched systems and
    VMs report the switch or a host bus id as the remote end, so the bus-id match finds none)."""
    if nvml is None or handle is None or peer is None:
        return 0
    try:
        status = nvml.nvmlDeviceGetP2PStatus(handle, peer, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
    except Exception:
        return 0
    if status != getattr(nvml, "NVML_P2P_STATUS_OK", 0):
        return 0
    active = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            active += 1 if nvml.nvmlDeviceGetNvLinkState(handle, link) else 0
        except Exception:
            continue
    return max(active, 1)


def _nvlink_count(nvml: Any, handle: Any, peer_bus: str) -> int:
    """Active NVLinks from ``handle`` whose remote end is the GPU at ``peer_bus``."""
    if nvml is None or handle is None or not peer_bus:
        return 0
    count = 0
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                continue
            remote = _text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
        except Exception:
            continue
        if remote == peer_bus:
            count += 1
    return count


def _other_devices(policy: ReservePolicy) -> list[DeviceInfo]:
    import torch

    out: list[DeviceInfo] = []
    host = _hostname()
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        total, available = _meminfo()  # unified memory: the system's RAM
        bw, fl = defaults.GPU_MEMORY_BANDWIDTH_BYTES_PER_S / 4, defaults.GPU_MATMUL_FLOPS_PER_S / 8
        budget = policy.budget_bytes("mps", total, available)
        out.append(DeviceInfo("mps:0", host, "mps", "Apple MPS", total, budget, bw, fl, "mps", free_bytes=available))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for index in range(xpu.device_count()):
            props = xpu.get_device_properties(index)
            total = int(props.total_memory)
            budget = policy.budget_bytes("xpu", total)
            bw, fl = defaults.GPU_MEMORY_BANDWIDTH_BYTES_PER_S, defaults.GPU_MATMUL_FLOPS_PER_S
            out.append(DeviceInfo(f"xpu:{index}", host, "xpu", props.name, total, budget, bw, fl, f"xpu:{index}"))
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
