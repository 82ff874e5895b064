"""Decode GEMV candidates timed the way decode runs them: back to back inside a CUDA graph.

Timing one call at a time (``triton.testing.do_bench``) is misleading for the small matrices: the
figure includes the host's launch of a Triton kernel (tens of µs), which a replayed graph never pays. Here each candidate is captured as a graph of calls over rotating weight copies
(more bytes than the L2 holds, so every call reads HBM) and the replay is timed with CUDA events:
µs per call, as inside a decode step. Every candidate's output is checked against float64.

Candidates: cuBLAS (dense only) and our GEMV tile configs; dense bf16 and Q8_0, plain and gathered
(MoE decode: one token's routed experts). A split-K variant (K cut into slices, float32 partials
summed by a second launch) was measured at commit da342d0 and won nowhere by more than 1 %: with
graphs, one pass already keeps every SM reading.

    python3 bench/gemv_graph.py --out bench/results/gemv_graph_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import graph_us, rel_err
from stagewise.kernels.gemv_triton import config_for as dense_config_for
from stagewise.kernels.gemv_triton import gemv
from stagewise.kernels.q8_0_gemv_triton import config_for as q8_config_for
from stagewise.kernels.q8_0_gemv_triton import gathered_config_for, q8_0_gemv
from stagewise.kernels.triton_launch import dependent_launch

DENSE = {"llama8b qkv": (6144, 4096), "llama8b o": (4096, 4096), "llama8b gate_up": (28672, 4096),
         "llama8b down": (4096, 14336), "llama8b head": (128256, 4096), "qwen3 router 128x2048": (128, 2048),
         "qwen3.6 router 256x2048": (256, 2048)}
Q8 = {"qwen3-30b qkv": (5120, 2048), "qwen3-30b o": (2048, 4096), "qwen3.6 in_proj": (12288, 2048),
      "qwen3.6 attn qkv+gate": (9216, 2048), "qwen3.6 out": (2048, 4096), "qwen3.6 shared gate_up": (1024, 2048),
      "qwen3.6 shared down": (2048, 512), "qwen3-30b head": (151936, 2048), "qwen3.6 head": (248320, 2048)}
# gathered: (experts, N, K, rows per token = x_repeat, tokens' rows)
Q8_GATHER = {"qwen3-30b experts gate_up": (128, 1536, 2048, 8), "qwen3-30b experts down": (128, 2048, 768, 1),
             "qwen3.6 experts gate_up": (256, 1024, 2048, 8), "qwen3.6 experts down": (256, 2048, 512, 1)}
BASE = [(1, 2048, 4, 3), (1, 1024, 4, 3), (2, 1024, 4, 4), (4, 512, 4, 3), (8, 512, 4, 3), (8, 512, 4, 4),
        (16, 256, 4, 3), (4, 1024, 8, 3), (8, 1024, 8, 3), (16, 512, 8, 3), (2, 2048, 8, 3), (4, 256, 2, 4),
        (32, 256, 8, 3), (2, 512, 2, 4)]
CANDIDATES = BASE
ROTATE_BYTES = 512 << 20  # weights touched per graph: well past the 60 MB L2


def _sweep(label: str, nbytes: int, fns: dict[str, Callable[[int], torch.Tensor]], ref: torch.Tensor,
           copies: int, current: str) -> dict[str, object]:
    row: dict[str, object] = {"shape": label, "bytes": nbytes, "copies": copies, "current": current, "candidates": {}}
    cands: dict[str, dict[str, float]] = {}
    for name, fn in fns.items():
        try:
            err = rel_err(fn(0), ref)
            us = graph_us(fn, copies)
        except Exception as exc:  # a config the compiler refuses (too many registers...) is reported, not fatal
            cands[name] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}  # type: ignore[dict-item]
            continue
        cands[name] = {"us": us, "GBps": nbytes / us / 1e3, "rel_err": err}
    row["candidates"] = cands
    ok = {k: v for k, v in cands.items() if "us" in v and v["rel_err"] < 1e-2}
    best = min(ok, key=lambda k: ok[k]["us"])
    row["best"] = best
    cur = cands.get(current, {})
    cub = cands.get("cublas", {})
    print(f"{label:28s} {nbytes / 1e6:7.1f} MB  best {best:22s} {ok[best]['us']:7.2f} us {ok[best]['GBps']:5.0f} GB/s"
          f" | current {current:22s} {cur.get('us', float('nan')):7.2f} us"
          + (f" | cuBLAS {cub['us']:7.2f} us" if "us" in cub else ""), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/gemv_graph_h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    report: dict[str, object] = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
                                 "date": datetime.datetime.now(datetime.UTC).isoformat(), "rows": []}
    rows: list[dict[str, object]] = []
    for label, (n, k) in DENSE.items():
        nbytes = n * k * 2
        copies = max(4, min(64, ROTATE_BYTES // nbytes))
        ws = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ ws[0].double().T
        fns: dict[str, Callable[[int], torch.Tensor]] = {
            "cublas": lambda i, ws=ws, x=x: torch.nn.functional.linear(x, ws[i])}
        for cfg in CANDIDATES:
            fns[str(cfg)] = lambda i, ws=ws, x=x, cfg=cfg: gemv(x, ws[i], config=cfg)
        rows.append(_sweep(f"dense {label} {n}x{k}", nbytes, fns, ref, copies, str(dense_config_for(n, k, dependent_launch(x)["GDC"]) or "cublas")))
        del ws
    for label, (n, k) in Q8.items():
        nbytes = n * k + n * k // 32 * 2
        copies = max(4, min(64, ROTATE_BYTES // nbytes))
        qs = [torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(copies)]
        sc = [(torch.rand(n, k // 32, device=dev) * 1e-3).to(torch.float16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ (qs[0].double() * sc[0].double().repeat_interleave(32, dim=1)).T
        fns = {str(cfg): (lambda i, qs=qs, sc=sc, x=x, cfg=cfg: q8_0_gemv(x, qs[i], sc[i], config=cfg))
               for cfg in CANDIDATES}
        rows.append(_sweep(f"q8_0 {label} {n}x{k}", nbytes, fns, ref, copies, str(q8_config_for(n, k))))
        del qs, sc
    for label, (e, n, k, rep) in Q8_GATHER.items():
        qs_all = torch.randint(-127, 128, (e, n, k), device=dev, dtype=torch.int8)
        sc_all = (torch.rand(e, n, k // 32, device=dev) * 1e-3).to(torch.float16)
        m = 8  # rows: 8 routed experts of one token
        nbytes = m * (n * k + n * k // 32 * 2)
        copies = 32
        gen = torch.Generator().manual_seed(0)
        idx = [torch.randperm(e, generator=gen)[:m].to(dev) for _ in range(copies)]
        x = torch.randn(m // rep, k, device=dev, dtype=torch.bfloat16)
        dq = qs_all[idx[0]].double() * sc_all[idx[0]].double().repeat_interleave(32, dim=2)
        ref = torch.einsum("mnk,mk->mn", dq, x.double().repeat_interleave(rep, dim=0))
        fns = {str(cfg): (lambda i, idx=idx, x=x, cfg=cfg, rep=rep, q=qs_all, s=sc_all:
                          q8_0_gemv(x, q, s, idx[i], config=cfg, x_repeat=rep)) for cfg in CANDIDATES}
        rows.append(_sweep(f"q8_0 gathered {label} 8x{n}x{k}", nbytes, fns, ref, copies, str(gathered_config_for(k))))
        del qs_all, sc_all
    report["rows"] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
