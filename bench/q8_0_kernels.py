"""Q8_0 decode kernels on the GPU: correctness against a float64 reference and time per call.

Compares, for the matrix shapes that dominate decode in the reference geometries, the GEMV kernel
(several tile configs), the tiled tl.dot kernel, and a dense bf16 matmul of the same matrix; and
the gathered-experts GEMV against a per-expert reference. Prints achieved bandwidth (bytes of the
int8 values + f16 scales read, over time) and writes JSON.

    python bench/q8_0_kernels.py --out bench/results/q8_0_kernels.json
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

from stagewise.weights.quant.q8_0 import Q8_0Weight
from stagewise.weights.quant.q8_0_gemv_triton import q8_0_gemv
from stagewise.weights.quant.q8_0_triton import q8_0_matmul

SHAPES = {"llama8b qkv-ish 4096x4096": (4096, 4096), "llama8b up 14336x4096": (14336, 4096),
          "llama8b down 4096x14336": (4096, 14336), "qwen3.6 head 248320x2048": (248320, 2048),
          "qwen3.6 attn q 8192x2048": (8192, 2048)}
CONFIGS = [(8, 512, 4, 4), (16, 256, 4, 4), (4, 1024, 4, 3), (8, 256, 2, 4), (32, 256, 8, 3), (16, 512, 8, 3)]


def _quantize(w: torch.Tensor) -> Q8_0Weight:
    blocks = w.float().unflatten(-1, (-1, 32))
    scale = blocks.abs().amax(-1).clamp(min=1e-8) / 127.0
    qs = torch.round(blocks / scale[..., None]).clamp(-127, 127).to(torch.int8).flatten(-2)
    return Q8_0Weight(qs.contiguous(), scale.to(torch.float16).contiguous())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/q8_0_kernels.json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    rows = []
    for label, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev) * 0.02
        q = _quantize(w)
        ref_w = q.dequantize(torch.float64)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ ref_w.T
        nbytes = q.nbytes
        row = {"shape": label, "bytes": nbytes, "configs": {}}
        for cfg in CONFIGS:
            y = q8_0_gemv(x, q.qs, q.scales, config=cfg)
            ms = triton.testing.do_bench(lambda cfg=cfg, x=x, q=q: q8_0_gemv(x, q.qs, q.scales, config=cfg), return_mode="median")
            row["configs"][str(cfg)] = {"rel_err": _rel(y, ref), "us": ms * 1e3, "GBps": nbytes / (ms * 1e-3) / 1e9}
        ms = triton.testing.do_bench(lambda x=x, q=q: q8_0_matmul(x, q.qs, q.scales), return_mode="median")
        row["tl_dot_kernel"] = {"rel_err": _rel(q8_0_matmul(x, q.qs, q.scales), ref), "us": ms * 1e3,
                                "GBps": nbytes / (ms * 1e-3) / 1e9}
        wd = w.to(torch.bfloat16)
        ms = triton.testing.do_bench(lambda x=x, wd=wd: torch.nn.functional.linear(x, wd), return_mode="median")
        row["dense_bf16"] = {"us": ms * 1e3, "GBps": wd.numel() * 2 / (ms * 1e-3) / 1e9}
        rows.append(row)
        best = min(row["configs"].items(), key=lambda kv: kv[1]["us"])
        print(f"{label:28s} gemv best {best[0]} {best[1]['us']:.1f} us {best[1]['GBps']:.0f} GB/s "
              f"err {best[1]['rel_err']:.1e} | tl.dot {row['tl_dot_kernel']['us']:.1f} us | "
              f"dense bf16 {row['dense_bf16']['us']:.1f} us {row['dense_bf16']['GBps']:.0f} GB/s")
    # gathered experts: Qwen3.6-35B-A3B decode (256 experts, top-8, 2*512 x 2048 and 2048 x 512)
    experts = {}
    for name, (n, k) in {"gate_up 1024x2048": (1024, 2048), "down 2048x512": (2048, 512)}.items():
        w = torch.randn(256, n, k, device=dev) * 0.02
        q = _quantize(w)
        idx = torch.randperm(256, device=dev)[:8]
        x = torch.randn(8, k, device=dev, dtype=torch.bfloat16)
        y = q.gather_matmul(idx, x)
        ref = torch.stack([x[i].double() @ q.expert(int(e)).dequantize(torch.float64).T for i, e in enumerate(idx)])
        ms = triton.testing.do_bench(lambda q=q, idx=idx, x=x: q.gather_matmul(idx, x), return_mode="median")
        read = 8 * n * k * 34 // 32
        experts[name] = {"rel_err": _rel(y, ref), "us": ms * 1e3, "GBps": read / (ms * 1e-3) / 1e9}
        print(f"experts {name:20s} {ms * 1e3:.1f} us {experts[name]['GBps']:.0f} GB/s err {experts[name]['rel_err']:.1e}")
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
           "gpu": torch.cuda.get_device_name(0), "gemv": rows, "gathered_experts": experts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
