"""The chunked delta rule's scan on a GPU: the Triton kernel against the torch loop it would replace.

Qwen3.6-35B-A3B / Qwen3.5 shapes (32 value heads, Dk = Dv = 128, 64-token chunks) at 512 and 2,048
tokens: max difference, and time per call (median, L2 flushed). The torch loop's time includes the
host issuing ~8 operations per chunk, which is what bounds the hybrids' prefill.

    python3 bench/delta_rule_scan.py --out bench/results/delta_rule_scan_h200.json
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

from stagewise.kernels.delta_rule_scan_triton import chunk_scan_triton
from stagewise.models.layers.delta_rule import chunk_scan


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/delta_rule_scan_h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    rows = []
    for tokens in (512, 2048):
        b, h, c, dk, dv = 1, 32, 64, 128, 128
        n = tokens // c
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, w = (torch.randn(b, h, n, c, dk, device=dev, generator=g) * 0.05 for _ in range(3))
        u = torch.randn(b, h, n, c, dv, device=dev, generator=g)
        a = torch.randn(b, h, n, c, c, device=dev, generator=g).tril() * 0.05
        decay = torch.rand(b, h, n, device=dev, generator=g) * 0.5 + 0.5
        s0 = torch.randn(b, h, dk, dv, device=dev, generator=g) * 0.1
        inputs = (q, k, u, w, a, decay, s0)
        want_out, want_s = chunk_scan(*inputs)
        got_out, got_s = chunk_scan_triton(*inputs)
        loop_ms = triton.testing.do_bench(lambda inputs=inputs: chunk_scan(*inputs), return_mode="median")
        kernel_ms = triton.testing.do_bench(lambda inputs=inputs: chunk_scan_triton(*inputs), return_mode="median")
        kernel32_ms = triton.testing.do_bench(lambda inputs=inputs: chunk_scan_triton(*inputs, block_v=32),
                                              return_mode="median")
        row = {"tokens": tokens, "chunks": n, "heads": h, "loop_ms": loop_ms, "kernel_ms": kernel_ms,
               "speedup": loop_ms / kernel_ms, "kernel_block_v32_ms": kernel32_ms, "max_abs_diff_out": float((got_out - want_out).abs().max()),
               "max_abs_diff_state": float((got_s - want_s).abs().max()),
               "max_abs_out": float(want_out.abs().max())}
        rows.append(row)
        print(f"{tokens:5d} tokens: loop {loop_ms:.3f} ms, kernel {kernel_ms:.3f} ms ({row['speedup']:.1f}x; 32 columns {kernel32_ms:.3f}), "
              f"max diff out {row['max_abs_diff_out']:.2e} state {row['max_abs_diff_state']:.2e}", flush=True)
    report = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
              "date": datetime.datetime.now(datetime.UTC).isoformat(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
