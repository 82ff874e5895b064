"""Planner speed: 8 devices x 128 blocks must plan in under 100 ms.

Cases: eight identical GPUs (one interchangeability class), and a mixed machine (two kinds,
two NVLink pairs). Prints a table and writes bench/results/plan_speed.json with the command,
machine and date. Run: ``PYTHONPATH=. .venv/bin/python bench/plan_speed.py``.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from stagewise.hardware.device_info import DeviceInfo
from stagewise.hardware.link import Link
from stagewise.hardware.topology import Topology
from stagewise.placement import plan, verify
from stagewise.spec.block_spec import BlockSpec, EndSpec
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

GB = 10**9


def spec_128() -> ModelSpec:
    blocks = tuple(
        BlockSpec(i, "attention", False, int(1.3 * GB), int(1.3 * GB), 2 * 650_000_000, 2048, 0, 0, 32768, 60000, 0, 32)
        for i in range(128)
    )
    head = EndSpec(2 * GB, 16_000, 0)
    tail = EndSpec(2 * GB, 2 * GB, 4 * GB, logits_values_per_token=128_000)
    return ModelSpec("synthetic-128", "test", "bf16", 8192, 128_000, blocks, head, tail)


def topology(mixed: bool) -> Topology:
    devices, links = [], []
    for i in range(8):
        big = not mixed or i < 4
        mem = 24 * GB if big else 48 * GB
        devices.append(
            DeviceInfo(f"sim:{i}", "host0", "sim", "sim", mem, mem - GB, (1000e9 if big else 768e9), (165e12 if big else 155e12))
        )
    if mixed:
        links = [Link("sim:0", "sim:1", "nvlink", 100e9, 1e-5, True), Link("sim:4", "sim:5", "nvlink", 100e9, 1e-5, True)]
    return Topology(tuple(devices), tuple(links))


def time_plan(spec: ModelSpec, topo: Topology, profile: Profile, objective: str) -> tuple[float, int]:
    plan(spec, topo, profile, objective=objective)  # warm
    times = []
    for _ in range(5):
        start = time.perf_counter()
        cert = plan(spec, topo, profile, objective=objective)
        times.append(time.perf_counter() - start)
    verify(cert, spec, topo, profile)
    return sorted(times)[2], len(cert.stages)


def main() -> int:
    spec, profile = spec_128(), Profile()
    rows = []
    for name, mixed in (("8 identical 24 GB", False), ("4x24 GB + 4x48 GB, 2 NVLink pairs", True)):
        for objective in ("latency", "throughput"):
            seconds, stages = time_plan(spec, topology(mixed), profile, objective)
            rows.append({"case": name, "objective": objective, "stages": stages, "median_ms": round(seconds * 1e3, 2)})
    print(f"{'case':40} {'objective':11} {'stages':>6} {'median ms':>10}")
    for r in rows:
        print(f"{r['case']:40} {r['objective']:11} {r['stages']:>6} {r['median_ms']:>10}")
    result = {
        "command": "PYTHONPATH=. " + " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.node()} {platform.machine()} {platform.processor() or platform.platform()}",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "blocks": spec.num_blocks,
        "devices": 8,
        "target_ms": 100,
        "rows": rows,
        "all_under_target": all(r["median_ms"] < 100 for r in rows),
    }
    out = Path(__file__).parent / "results" / "plan_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["all_under_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
