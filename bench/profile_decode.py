"""Where a decode token's time goes on each GPU: torch.profiler's kernel timeline over graph replays.

Greedy-decodes ``--gen`` tokens after a ``--prompt``-token prefill and profiles the last ``--profile``
tokens. From the kernel and copy records (CUDA graphs' kernels are recorded one by one) it reports,
per device and per token: busy time (kernels + copies), idle time and the largest idle gaps, kernel
count, and the kernels grouped by name (total µs per token, µs per call). Wall time per token
beside it shows how much of a token no GPU works on (host sampling, launch, synchronization).

    python3 bench/profile_decode.py random:llama-3.1-8b --devices cuda:0,cuda:1 --placement pipeline:2 \
        --out bench/results/profile_decode_llama8b_2gpu.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams


def _short(name: str) -> str:
    name = re.sub(r"<.*", "", name)
    return name[:70]


def _idle_gaps(events: list[dict[str, object]]) -> list[tuple[float, str, str]]:
    """The stretches in which none of ``events`` runs, between the first start and the last end:
    (microseconds, the record that ended last before, the record after), in time order."""
    gaps: list[tuple[float, str, str]] = []
    reach, last_name = None, ""
    for e in sorted(events, key=lambda e: float(e["ts"])):  # type: ignore[arg-type]
        ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])  # type: ignore[arg-type]
        name = f"{_short(str(e['name']))[:40]}@{e['args'].get('device', -1)}"  # type: ignore[union-attr]
        if reach is not None and ts > reach:
            gaps.append((ts - reach, last_name, name))
        if reach is None or end > reach:
            reach, last_name = end, name
    return gaps


def device_timeline(trace: dict[str, object], tokens: int) -> dict[str, object]:
    events = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"  # type: ignore[union-attr]
              and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_dev: dict[int, list[dict[str, object]]] = collections.defaultdict(list)
    for e in events:
        by_dev[int(e["args"].get("device", -1))].append(e)  # type: ignore[index,union-attr]
    out: dict[str, object] = {}
    starts = [float(e["ts"]) for e in events]  # type: ignore[arg-type]
    ends = [float(e["ts"]) + float(e["dur"]) for e in events]  # type: ignore[arg-type]
    span_us = max(ends) - min(starts) if events else 0.0
    out["span_us_per_token"] = span_us / tokens
    # time no GPU works (the token's chain waiting on launches, copies and cross-device events), with
    # the records on either side of the largest such gaps
    idle = _idle_gaps(events)
    out["all_idle_us_per_token"] = sum(g for g, _, _ in idle) / tokens
    pairs: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for g, before, after in idle:
        pairs[(before, after)].append(g)
    out["all_idle_by_neighbours"] = [{"before": b, "after": a, "per_token": len(v) / tokens, "us_per_token": sum(v) / tokens}
                                     for (b, a), v in sorted(pairs.items(), key=lambda kv: -sum(kv[1]))[:12]]
    for dev, evs in sorted(by_dev.items()):
        evs.sort(key=lambda e: float(e["ts"]))  # type: ignore[arg-type]
        busy = sum(float(e["dur"]) for e in evs)  # type: ignore[arg-type]  # kernels that overlap count twice
        gaps = [g for g, _, _ in _idle_gaps(evs)]
        groups: dict[str, list[float]] = collections.defaultdict(list)
        for e in evs:
            groups[_short(str(e["name"]))].append(float(e["dur"]))  # type: ignore[arg-type]
        top = sorted(groups.items(), key=lambda kv: sum(kv[1]), reverse=True)[:25]
        big = sorted(gaps, reverse=True)
        out[f"device{dev}"] = {
            "busy_us_per_token": busy / tokens,
            "records_per_token": len(evs) / tokens,
            "idle_us_per_token": sum(gaps) / tokens,
            "gaps_over_5us_per_token": sum(1 for g in gaps if g > 5) / tokens,
            "idle_in_gaps_under_5us_per_token": sum(g for g in gaps if g <= 5) / tokens,
            "largest_gaps_us": [round(g, 1) for g in big[: 2 * tokens]][:12],
            "kernels": [{"name": k, "calls_per_token": len(v) / tokens, "us_per_token": sum(v) / tokens,
                         "us_per_call": sum(v) / len(v)} for k, v in top],
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="cuda:0")
    ap.add_argument("--placement", default="auto")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--profile", type=int, default=16, help="profile the last this many tokens")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default="bench/results/profile_decode.json")
    args = ap.parse_args()
    loaded = load_model(args.model, devices=args.devices, placement=args.placement, context=args.context, dtype="bfloat16")
    generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=loaded.prefill_chunk)
    prompt = tuple(torch.randint(0, 1000, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist())
    request = GenerationRequest(prompt, args.gen, SamplingParams(temperature=0.0))
    for _ in generator.stream(request):  # warm-up: graphs captured, kernels compiled
        pass
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    first = args.gen - args.profile
    t0 = 0.0
    for i, _event in enumerate(generator.stream(request)):
        if i == first:
            for d in range(torch.cuda.device_count()):
                torch.cuda.synchronize(d)
            prof.start()
            t0 = time.perf_counter()
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)
    wall = time.perf_counter() - t0
    prof.stop()
    tokens = args.gen - 1 - first  # steps run after the profiler started (the host loop)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.loads(Path(path).read_text())
    report: dict[str, object] = {"command": "python3 " + " ".join(sys.argv),
                                 "date": datetime.datetime.now(datetime.UTC).isoformat(),
                                 "device": torch.cuda.get_device_name(0), "tokens_profiled": tokens,
                                 "wall_us_per_token_profiled": wall * 1e6 / tokens,
                                 "stages": [str(s.device) for s in loaded.pipeline.stages]}
    # decoding one token ahead of the host, the first profiled step was launched before the profiler
    # started: count the steps by the greedy sampler's launches (one per step) where it ran
    sampled = sum(1 for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
                  and e.get("cat") == "kernel" and str(e.get("name", "")).startswith("_slice_kernel"))
    tokens = sampled or tokens
    report["tokens_profiled"] = tokens
    report["wall_us_per_token_profiled"] = wall * 1e6 / tokens
    report |= device_timeline(trace, tokens)
    print(json.dumps({k: v for k, v in report.items() if not k.startswith(("device", "all_idle_by"))}, indent=None))
    for row in report["all_idle_by_neighbours"]:  # type: ignore[attr-defined]
        print(f"   idle {row['us_per_token']:7.1f} us/tok {row['per_token']:5.2f}x  {row['before']} -> {row['after']}")
    for k, v in report.items():
        if k.startswith("device") and isinstance(v, dict):
            print(k, {kk: (round(vv, 1) if isinstance(vv, float) else vv) for kk, vv in v.items() if kk != "kernels"})
            for row in v["kernels"][:14]:
                print(f"   {row['us_per_token']:8.1f} us/tok {row['calls_per_token']:6.1f}x {row['us_per_call']:7.2f} us  {row['name']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    loaded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
