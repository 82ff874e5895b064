"""Decode GEMV tile configs on the GPU: our Triton GEMV (dense bf16, and the Q8_0 one) vs cuBLAS.

For the weight shapes that dominate decode in the reference geometries, times every candidate
config at one token (L2 flushed between calls, median), checks the result against a float64
reference and reports achieved bandwidth. The fastest config per shape class goes into
``stagewise/kernels/gemv_triton.py:config_for`` / ``q8_0_gemv_triton.py`` by hand (fixed configs
keep staged and single-device runs bit-identical).

    python bench/gemv_configs.py --out bench/results/gemv_configs_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.kernels.gemv_triton import config_for, gemv
from stagewise.weights.quant.q8_0_gemv_triton import CONFIG as Q8_CONFIG
from stagewise.weights.quant.q8_0_gemv_triton import q8_0_gemv

DENSE = {"llama8b qkv 6144x4096": (6144, 4096), "llama8b o 4096x4096": (4096, 4096),
         "llama8b gate_up 28672x4096": (28672, 4096), "llama8b down 4096x14336": (4096, 14336),
         "llama8b head 128256x4096": (128256, 4096), "qwen3.6 router 256x2048": (256, 2048)}
Q8 = {"qwen3.6 in_proj 12288x2048": (12288, 2048), "qwen3.6 out 2048x4096": (2048, 4096),
      "qwen3.6 head 248320x2048": (248320, 2048), "qwen3-30b q 4096x2048": (4096, 2048)}
CONFIGS = [(8, 512, 4, 3), (8, 512, 4, 4), (4, 512, 4, 3), (16, 256, 4, 3), (4, 1024, 4, 3), (8, 1024, 8, 3), (2, 1024, 4, 4),
           (16, 512, 8, 3), (32, 256, 8, 3), (4, 256, 2, 4), (1, 2048, 4, 3)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _time_us(fn: object) -> float:
    return float(triton.testing.do_bench(fn, return_mode="median")) * 1e3  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/gemv_configs_h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    report: dict[str, object] = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
                                 "date": datetime.datetime.now(datetime.UTC).isoformat(), "dense": [], "q8_0": []}
    for label, (n, k) in DENSE.items():
        w = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ w.double().T
        nbytes = w.numel() * 2
        row: dict[str, object] = {"shape": label, "bytes": nbytes, "configs": {}}
        for cfg in CONFIGS:
            us = _time_us(lambda cfg=cfg, x=x, w=w: gemv(x, w, config=cfg))
            row["configs"][str(cfg)] = {"us": us, "GBps": nbytes / us / 1e3,  # type: ignore[index]
                                        "rel_err": _rel(gemv(x, w, config=cfg), ref)}
        us = _time_us(lambda x=x, w=w: torch.nn.functional.linear(x, w))
        row["cublas"] = {"us": us, "GBps": nbytes / us / 1e3, "rel_err": _rel(torch.nn.functional.linear(x, w), ref)}
        row["current_config"] = str(config_for(n, k))
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"])  # type: ignore[union-attr]
        row["best"] = best[0]
        report["dense"].append(row)  # type: ignore[union-attr]
        print(f"dense {label:28s} best {best[0]:18s} {best[1]['us']:7.1f} us {best[1]['GBps']:5.0f} GB/s | "
              f"current {row['configs'][row['current_config']]['GBps']:5.0f} GB/s | "  # type: ignore[index]
              f"cuBLAS {row['cublas']['us']:7.1f} us {row['cublas']['GBps']:5.0f} GB/s", flush=True)  # type: ignore[index]
    for label, (n, k) in Q8.items():
        qs = torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8)
        scales = (torch.rand(n, k // 32, device=dev) * 1e-3).to(torch.float16)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        nbytes = qs.numel() + scales.numel() * 2
        row = {"shape": label, "bytes": nbytes, "configs": {}}
        for cfg in CONFIGS:
            us = _time_us(lambda cfg=cfg, x=x, qs=qs, scales=scales: q8_0_gemv(x, qs, scales, config=cfg))
            row["configs"][str(cfg)] = {"us": us, "GBps": nbytes / us / 1e3}  # type: ignore[index]
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"])  # type: ignore[union-attr]
        row["best"] = best[0]
        row["current_config"] = str(Q8_CONFIG)
        report["q8_0"].append(row)  # type: ignore[union-attr]
        print(f"q8_0  {label:28s} best {best[0]:18s} {best[1]['us']:7.1f} us {best[1]['GBps']:5.0f} GB/s | "
              f"current {row['configs'].get(str(Q8_CONFIG), {}).get('GBps', float('nan')):5.0f} GB/s", flush=True)  # type: ignore[union-attr]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
