"""One-off (issue 44, session 15): the few-rows Q8_0 GEMM's tiles at 8 rows on Qwen3.6-35B-A3B's dense matrices
(in_proj 1.57 TB/s, out_proj 1.08 TB/s on an H100 with q8_0_gemm.DENSE_DECODE_TILES and 264 programs at least):
block_n, num_warps, num_stages, block_k swept with `DENSE_DECODE_TILES` patched, µs per call as decode runs it
(bench/kernel_timing.graph_us over rotating copies past L2).

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/session15/dense_tiles_sweep.py [--rows 8] [--out F]
"""
import argparse
import dataclasses
import itertools
import json
import sys
import time

import torch

sys.path.insert(0, ".")
import stagewise.kernels.q8_0_gemm as g
from bench.kernel_timing import graph_us

SHAPES = (("in_proj", 12352, 2048), ("out_proj/o", 2048, 4096), ("attn qkv", 9216, 2048),
          ("shared gate_up", 1024, 2048), ("shared down", 2048, 512))
p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=8)
p.add_argument("--seconds", type=float, default=200)
p.add_argument("--out", default=None)
args = p.parse_args()
t0 = time.time()
base = g.DENSE_DECODE_TILES
data = {}
for name, n, k in SHAPES:
    nbytes = n * k * 34 // 32
    copies = max(1, -(-(400 << 20) // nbytes))
    data[name] = (nbytes, copies, [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)],
                  [(torch.rand(n, k // 32, device="cuda") / 64).half() for _ in range(copies)])
x = {k: torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16) for k in (512, 2048, 4096)}
results = []
for bn, warps, stages, bk, floor in itertools.product((32, 64), (2, 4), (3, 5), (128, 256), (264, 528)):
    if time.time() - t0 > args.seconds:
        break
    g.DENSE_DECODE_TILES = dataclasses.replace(base, block_n=bn, num_warps=warps, num_stages=stages, block_k=bk)
    g.DENSE_MIN_PROGRAMS = floor
    g.decode_tiles.cache_clear()
    row = {"block_n": bn, "num_warps": warps, "num_stages": stages, "block_k": bk, "min_programs": floor}
    total = 0.0
    for name, n, k in SHAPES:
        nbytes, copies, qs, sc = data[name]
        try:
            us = graph_us(lambda i: g.q8_0_gemm(x[k], qs[i % copies], sc[i % copies]), calls=max(8, 2 * copies))
        except Exception as e:  # noqa: BLE001 - a config the compiler refuses is reported, not fatal
            row[name] = f"error {type(e).__name__}"
            total = float("inf")
            continue
        row[name] = round(us, 2)
        total += us
    row["sum_us"] = round(total, 2)
    results.append(row)
    print(json.dumps(row), flush=True)
results.sort(key=lambda r: r["sum_us"])
print("best", json.dumps(results[:3]))
if args.out:
    json.dump({"rows": args.rows, "results": results}, open(args.out, "w"), indent=1)
