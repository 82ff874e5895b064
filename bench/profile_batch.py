"""Where a batched decode step's GPU time goes: N greedy streams decoding together, a few steps under
torch.profiler, kernels ranked by total device time.

    python3 bench/profile_batch.py random:qwen3-30b-a3b@q8_0 --streams 32 [--steps 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError


def _raise(error: StagewiseError) -> None:
    raise error


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--devices", default="cuda:0")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    loaded = load_model(args.model, args.devices, "single", args.prompt + 256, max_seqs=args.streams,
                        prefill_chunk=min(args.prompt, 512))
    batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk)
    g = torch.Generator().manual_seed(0)

    def ok(_event: TokenEvent) -> bool:
        return True

    for _ in range(args.streams):
        prompt = tuple(torch.randint(0, loaded.config.vocab_size, (args.prompt,), generator=g).tolist())
        batcher.add(Sequence(GenerationRequest(prompt, 200, SamplingParams(temperature=0.0)), ok, _raise,
                             lambda: False))
    while batcher.staging or batcher.queue or batcher._regroup_needed:
        batcher.iterate()
    for _ in range(4):
        batcher.iterate()  # graphs of this shape captured
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        batcher.iterate()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / args.steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            batcher.iterate()
        torch.cuda.synchronize()
    rows: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(event.name, []).append(event.device_time_total if hasattr(event, "device_time_total")
                                                   else event.cuda_time_total)
    table: list[dict[str, Any]] = sorted(
        ({"kernel": name[:90], "us_per_step": sum(v) / args.steps, "calls_per_step": len(v) / args.steps}
         for name, v in rows.items()), key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in table)
    print(f"{args.model} streams={args.streams}: step {step_s * 1e3:.2f} ms wall, kernels {total / 1e3:.2f} ms, "
          f"{args.streams / step_s:.0f} tok/s")
    for r in table[:18]:
        print(f"{r['us_per_step']:9.1f} us  {r['calls_per_step']:6.1f}x  {r['kernel']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": " ".join(["python3", *sys.argv]), "step_s": step_s, "kernels_us_per_step": total,
                       "top": table[:40]}, fh, indent=1)
    loaded.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
