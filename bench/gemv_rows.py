"""The decode GEMVs at several rows: does a step of M rows read each weight from memory once?

A decode step of 2-16 rows runs the dense, Q8_0 and packed GEMVs with one program per (output row,
column tile). Which programs run together decides the memory traffic: if a row's programs sweep the
whole matrix before the next row's start, a matrix larger than L2 (an output head, a fused input
projection) is read from memory once per row. Each case is timed the way decode runs it (a CUDA graph
of back-to-back calls over rotating weight copies, more bytes than L2 holds: ``graph_us``), as µs per
call and as weight bytes over time (TB/s); run it from two trees to compare kernels.

    python3 bench/gemv_rows.py [--rows 1,2,4,8,16] [--kernels gemv,gemm] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import graph_us
from stagewise.kernels.gemv_triton import config_for, gemv
from stagewise.kernels.q8_0_gemm import q8_0_gemm
from stagewise.kernels.q8_0_gemv_triton import q8_0_gemv

# (label, out, in, kind): Qwen3.6-35B-A3B's dense Q8_0 matrices and head; Llama-3.1-8B's bf16 ones
CASES = (
    ("qwen3.6 head q8_0", 248320, 2048, "q8_0"),
    ("qwen3.6 linear-attn in_proj q8_0", 12352, 2048, "q8_0"),
    ("qwen3.6 linear-attn out_proj q8_0", 2048, 4096, "q8_0"),
    ("llama-8b head bf16", 128256, 4096, "bf16"),
    ("llama-8b down bf16", 4096, 14336, "bf16"),
)
L2_MULTIPLE_BYTES = 400 << 20  # rotating copies past this many bytes: every call reads memory


def _case(n: int, k: int, kind: str, rows: int, kernel: str) -> tuple[float, int]:
    """µs per call and the weight's bytes; ``kernel`` "gemm": a Q8_0 weight through :func:`q8_0_gemm` (the few-rows
    tensor-core kernel, split K) instead of the GEMV."""
    nbytes = n * k * (34 / 32 if kind == "q8_0" else 2)
    copies = max(1, int(-(-L2_MULTIPLE_BYTES // nbytes)))
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    if kind == "q8_0":
        qs = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies)]
        scales = [(torch.rand(n, k // 32, device="cuda") / 64).half() for _ in range(copies)]
        matmul = q8_0_gemm if kernel == "gemm" else q8_0_gemv
        def fn(i: int) -> torch.Tensor:
            return matmul(x, qs[i % copies], scales[i % copies])
    else:
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(copies)]
        config = config_for(n, k, overlapped=True)
        def fn(i: int) -> torch.Tensor:
            return gemv(x, ws[i % copies], config=config)
    us = graph_us(fn, calls=max(8, 2 * copies))
    return us, int(nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--kernels", default="gemv", help="Q8_0 cases: gemv, gemm (q8_0_gemm's few-rows kernel) or both")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    kernels = args.kernels.split(",")
    for label, n, k, kind in CASES:
        for kernel in kernels if kind == "q8_0" else ["gemv"]:
            for m in rows:
                us, nbytes = _case(n, k, kind, m, kernel)
                row = {"case": label, "kernel": kernel, "out": n, "in": k, "rows": m, "us": round(us, 2),
                       "tb_s": round(nbytes / us / 1e6, 3)}
                results.append(row)
                print(f"{label:36s} {kernel} rows {m:3d}: {us:9.1f} us  {row['tb_s']:6.2f} TB/s (weight bytes once)",
                      flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "command": "python3 bench/gemv_rows.py " + " ".join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
