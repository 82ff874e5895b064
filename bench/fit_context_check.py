"""The load check on a GPU, as ``stagewise serve`` runs it: certified charge vs the allocator's peak.

Loads MODEL as ``serve`` would (``--max-seqs auto``, ``--context`` as given or the longest that fits),
warms up with the full-context step, then serves one long prompt (default 30,000 tokens) and generates
(default 256 tokens) through the batcher. Records, per stage, every part planned beside measured:
weights and state counted from the tensors, workspace as ``torch.cuda.max_memory_allocated`` over the
warm-up, the full-context step and the long request above what was resident (after the warm-up's
captures, plus the CUDA graphs' idle pool blocks: ``runtime/peak_memory.py``), and the certified total
beside that peak (the issue's target: peak <= charge and >= 0.9 of it). Also the allocator's reserved
peak, the warm-up's time and the request's time to first token and decode rate.

    python3 bench/fit_context_check.py random:qwen3.6-35b-a3b@q4_k --devices cuda:0@22.76GB --context 32768 \
        --prompt 30000 --gen 256 --json OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.engine import Engine
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.load_settings import LoadSettings
from stagewise.engine.model_loading import load
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError
from stagewise.runtime.peak_memory import PeakMeter
from stagewise.server.load_display import placement_lines
from stagewise.server.random_tokenizer import with_demo_tokenizer


def _raise(error: StagewiseError) -> None:
    raise error


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--devices", default="cuda:0@22.76GB")
    ap.add_argument("--context", type=int, default=None)
    ap.add_argument("--max-seqs", default="auto")
    ap.add_argument("--kv-dtype", default=None)
    ap.add_argument("--prompt", type=int, default=30000)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    settings = LoadSettings(model=args.model, devices=args.devices, context=args.context, kv_dtype=args.kv_dtype,
                            max_seqs=None if args.max_seqs == "auto" else int(args.max_seqs))
    t0 = time.perf_counter()
    model = with_demo_tokenizer(load(settings))
    load_s = time.perf_counter() - t0
    try:
        engine = Engine(model)
        devices = [stage.spec.torch_device for stage in model.pipeline.stages]
        meter = PeakMeter(devices)
        meter.start()
        for d in meter.devices:
            torch.cuda.reset_peak_memory_stats(d)
        t0 = time.perf_counter()
        warm = engine.warm_up(full_context=True)
        warm_s = time.perf_counter() - t0
        after_warm_up = [c.to_dict() for c in model.charge_checks()]
        # the long request, as a client's: through the batcher, greedy
        prompt = tuple(1 + (i * 7919) % (model.config.vocab_size - 1) for i in range(min(args.prompt,
                                                                                          model.max_context - 2)))
        gen = max(1, min(args.gen, model.max_context - len(prompt)))
        times: list[float] = []

        def sink(_event: TokenEvent) -> bool:
            times.append(time.perf_counter())
            return True

        t0 = time.perf_counter()
        engine.batcher.add(Sequence(GenerationRequest(prompt, gen, SamplingParams(temperature=0.0)), sink, _raise,
                                    lambda: False))
        while engine.batcher.active:
            engine.batcher.iterate()
        engine.batcher.drain()
        # the warm-up's own reading covers the captures; its meter's checkpoint restarted the devices' peak
        # counters, so this one reads the full-context step and the long request, graphs' idle blocks added
        warm_peaks = model.peaks
        model.peaks = {d: max(p, warm_peaks.get(d, p), key=lambda r: r.peak_bytes) for d, p in meter.read().items()}
        reserved = {d: torch.cuda.max_memory_reserved(torch.device(d)) for d in meter.devices}
        checks = model.charge_checks()
        for line in placement_lines(model):
            print(line)
        result: dict[str, Any] = {
            "command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
            "machine": platform.node(), "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "torch": torch.__version__, "profile": model.profile.to_dict(), "choice": model.choice,
            "load_s": load_s, "warm_up_s": warm_s, "warm_up": warm.summary(),
            "prompt_tokens": len(prompt), "generated_tokens": len(times),
            "ttft_s": times[0] - t0 if times else None,
            "decode_tokens_per_s": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None,
            "charges_after_warm_up": after_warm_up, "charges": [c.to_dict() for c in checks],
            "peaks": {d: p.to_dict() for d, p in model.peaks.items()}, "max_memory_reserved_bytes": reserved,
            "targets": [{"stage": c.stage, "peak_within_charge": (c.measured_peak_bytes or 0) <= c.planned_total_bytes,
                         "peak_over_charge": c.peak_ratio,
                         "workspace_within_plan": (c.measured_workspace_bytes or 0) <= c.planned_workspace_bytes}
                        for c in checks],
        }
        print(json.dumps({k: result[k] for k in ("choice", "prompt_tokens", "generated_tokens", "ttft_s",
                                                 "decode_tokens_per_s", "targets")}, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    finally:
        model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
