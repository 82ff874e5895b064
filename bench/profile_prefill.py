"""Where a prefill's time goes: torch.profiler over one prompt (in ``--chunk``-token steps), top
kernels by device time, and each GPU's busy time beside the wall time (do the stages overlap?).

    python bench/profile_prefill.py random:qwen3.6-35b-a3b@q8_0 --devices cuda:0@22.760GB,cuda:1@22.766GB \
        --prompt 512 --out bench/results/profile_prefill_qwen36.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.profile_decode import device_timeline
from stagewise.engine.model_loading import load_model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="cuda:0")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=0, help="prefill chunk (default: the whole prompt)")
    ap.add_argument("--out", default="bench/results/profile_prefill.json")
    args = ap.parse_args()
    loaded = load_model(args.model, devices=args.devices, context=4096, dtype="bfloat16", prefill_chunk=args.chunk or args.prompt)
    pipeline = loaded.pipeline
    tokens = torch.randint(0, 1000, (1, args.prompt))
    chunk = args.chunk or args.prompt

    def once() -> float:
        pipeline.reset(0)
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        for lo in range(0, args.prompt, chunk):
            pipeline.step(tokens[:, lo : lo + chunk], torch.arange(lo, min(lo + chunk, args.prompt))[None], start=lo)
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)
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
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        timeline = device_timeline(json.loads(Path(path).read_text()), 1)
    busy = {k: round(v["busy_us_per_token"] / 1e3, 2) for k, v in timeline.items()  # type: ignore[index]
            if k.startswith("device") and k != "device-1"}
    report = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "device": torch.cuda.get_device_name(0), "prompt_tokens": args.prompt, "warm_step_s": warm,
              "profiled_step_s": step_s, "kernels_device_ms": device_ms, "kernel_launches": launches, "chunk_tokens": chunk,
              "busy_ms_per_device": busy, "top": rows}
    print(f"step {step_s * 1e3:.1f} ms (warm {[round(w * 1e3, 1) for w in warm]}), kernels {device_ms:.1f} ms "
          f"device over {launches} launches; busy per device (ms) {busy}")
    for r in rows[:14]:
        print(f"  {r['device_ms']:8.2f} ms {r['calls']:6d}x  {r['name']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    loaded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
