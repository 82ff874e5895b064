"""Where a prefill step's time goes: torch.profiler over one chunk, top kernels by device time.

    python bench/profile_prefill.py random:qwen3.6-35b-a3b@q8_0 --devices cuda:0@22.760GB,cuda:1@22.766GB \
        --prompt 512 --out bench/results/profile_prefill_qwen36.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="cuda:0")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--out", default="bench/results/profile_prefill.json")
    args = ap.parse_args()
    loaded = load_model(args.model, devices=args.devices, context=4096, dtype="bfloat16", prefill_chunk=args.prompt)
    pipeline = loaded.pipeline
    tokens = torch.randint(0, 1000, (1, args.prompt))
    positions = torch.arange(args.prompt)[None]

    def once() -> float:
        pipeline.reset(0)
        t0 = time.perf_counter()
        pipeline.step(tokens, positions, start=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    warm = [once() for _ in range(2)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step_s = once()
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:20]:
        rows.append({"name": e.key[:90], "calls": e.count, "device_ms": e.device_time_total / 1e3,
                     "host_ms": e.cpu_time_total / 1e3})
    device_ms = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / 1e3
    launches = sum(e.count for e in prof.key_averages() if e.device_type.name == "CUDA")
    report = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "device": torch.cuda.get_device_name(0), "prompt_tokens": args.prompt, "warm_step_s": warm,
              "profiled_step_s": step_s, "kernels_device_ms": device_ms, "kernel_launches": launches, "top": rows}
    print(f"step {step_s * 1e3:.1f} ms (warm {[round(w * 1e3, 1) for w in warm]}), kernels {device_ms:.1f} ms "
          f"device over {launches} launches")
    for r in rows[:14]:
        print(f"  {r['device_ms']:8.2f} ms {r['calls']:6d}x  {r['name']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    loaded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
