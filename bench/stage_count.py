"""Decode and prefill speed of one model as 1, 2, 3 and 4 stages on the same devices: the cost of
each extra stage boundary. Also checks that every stage count generates the same greedy tokens.

    python bench/stage_count.py random:tiny-qwen3 --devices cpu:4x1GiB --out bench/results/stage_count_cpu.json
    python bench/stage_count.py random:llama-3.1-8b --devices cuda:0,cuda:1,cuda:2,cuda:3 --out ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="cpu:4x1GiB")
    ap.add_argument("--max-stages", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--out", default="bench/results/stage_count_cpu.json")
    args = ap.parse_args()
    rows = []
    for n in range(1, args.max_stages + 1):
        cmd = [sys.executable, "-m", "stagewise", "bench", args.model, "--devices", args.devices, "--placement",
               f"pipeline:{n}", "--prompt", str(args.prompt), "--gen", str(args.gen), "--repeats", "3", "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
        result = json.loads(proc.stdout)
        s = result["stagewise"]
        rows.append({"stages": n, "summary": result["summary"], "decode_tokens_per_s": s["decode_tokens_per_s"],
                     "prefill_tokens_per_s": s["prefill_tokens_per_s"], "handoff_s_per_token": s["handoff_s_per_token"],
                     "stage_step_s": s["stage_step_s"], "tokens_head": s["tokens_head"]})
        print(f"{n} stages: decode {s['decode_tokens_per_s']:.1f} tok/s, prefill {s['prefill_tokens_per_s']:.0f} tok/s,"
              f" handoff {s['handoff_s_per_token'] * 1e6:.1f} us", flush=True)
    base = rows[0]["decode_tokens_per_s"]
    for r in rows:
        r["decode_vs_one_stage"] = r["decode_tokens_per_s"] / base
        r["same_tokens_as_one_stage"] = r["tokens_head"] == rows[0]["tokens_head"]
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
           "machine": platform.node(), "model": args.model, "devices": args.devices, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0 if all(r["same_tokens_as_one_stage"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
