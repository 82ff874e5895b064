"""One GPU vs a two-GPU pipeline on the same random weights: bit-identical, and charges vs the allocator.

For each model: load it on cuda:0 alone and as cuda:0 -> cuda:1, run the same chunked prefill and
greedy decode, and compare logits, final features, KV / conv / recurrent state and tokens with
``torch.equal``. Also records, per stage, the planned charge beside what the CUDA allocator holds
after loading (weights + state) and the peak during prefill (workspace).

    python bench/gpu_exact.py random:llama-3.1-8b random:qwen3.5-4b --out bench/results/gpu_exact.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from tests.staged import Trace, run_trace


def _allocated() -> list[int]:
    return [torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())]


def _run(model: str, devices: str, placement: str, prompt: list[int], chunk: int, steps: int,
         context: int) -> tuple[Trace, list[int], list[dict[str, Any]]]:
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)
    before = _allocated()
    loaded = load_model(model, devices=devices, placement=placement, context=context, dtype="bfloat16",
                        prefill_chunk=chunk)
    after = _allocated()
    for i in range(torch.cuda.device_count()):
        torch.cuda.reset_peak_memory_stats(i)
    trace = run_trace(loaded.pipeline, prompt, chunk=chunk, decode_steps=steps)
    # the serving loop: greedy on the device, one token ahead of the host (the token written into the
    # entry stage's graph input by the sampling kernel, across GPUs when staged)
    request = GenerationRequest(tuple(prompt), steps, SamplingParams(temperature=0.0))
    generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=chunk)  # the trace's chunking
    lookahead = [event.sample.token for event in generator.stream(request)]
    rows = []
    for st, cert in zip(loaded.pipeline.stages, loaded.placement_json["stages"], strict=False):
        idx = st.device.index or 0
        resident = after[idx] - before[idx]
        peak = torch.cuda.max_memory_allocated(idx) - after[idx]
        charge = cert["charge"]
        planned_resident = charge["weights_bytes"] + charge["state_bytes"]
        rows.append({"device": cert["device"], "blocks": cert["blocks"],
                     "planned_weights_bytes": charge["weights_bytes"], "planned_state_bytes": charge["state_bytes"],
                     "measured_resident_bytes": resident, "planned_resident_bytes": planned_resident,
                     "resident_ratio_planned_over_measured": planned_resident / resident,
                     "planned_workspace_bytes": charge["workspace_bytes"], "measured_prefill_peak_bytes": peak,
                     "planned_total_bytes": charge["total_bytes"], "budget_bytes": cert["budget_bytes"]})
    loaded.close()
    del loaded
    torch.cuda.empty_cache()
    return trace, lookahead, rows


def _first_mismatch(a: list[torch.Tensor], b: list[torch.Tensor]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if not torch.equal(x.cpu(), y.cpu()):
            return i
    return None


def _compare(a: Trace, b: Trace) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens_equal": a.tokens == b.tokens,
           "logits_equal": all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a.logits, b.logits, strict=False)),
           "features_equal": all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a.features, b.features, strict=False)),
           "states_compared": sorted({k.split(".", 1)[1] for k in a.states}),
           "states_equal": a.states.keys() == b.states.keys()
           and all(torch.equal(a.states[k].cpu(), b.states[k].cpu()) for k in a.states)}
    out["bit_identical"] = all(v for k, v in out.items() if k.endswith("_equal"))
    out["first_logits_mismatch_step"] = _first_mismatch(a.logits, b.logits)
    out["steps_compared"] = len(a.logits)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--out", default="bench/results/gpu_exact.json")
    args = ap.parse_args()
    results = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
               "machine": platform.node(), "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
               "torch": torch.__version__, "models": {}}
    for model in args.models:
        gen = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, 1000, (args.prompt,), generator=gen).tolist()
        single, ahead1, rows1 = _run(model, "cuda:0", "single", prompt, args.chunk, args.steps, args.context)
        staged, ahead2, rows2 = _run(model, "cuda:0,cuda:1", "pipeline:2", prompt, args.chunk, args.steps, args.context)
        cmp = _compare(single, staged)
        # the generator's loop, both placements: the same tokens as each other and as the host loop
        cmp["lookahead_tokens_equal"] = bool(ahead1) and ahead1 == ahead2
        cmp["lookahead_matches_host_loop"] = ahead1 == single.tokens[: len(ahead1)]
        cmp["lookahead_tokens"] = {"single": ahead1, "staged": ahead2}
        cmp["bit_identical"] = cmp["bit_identical"] and cmp["lookahead_tokens_equal"] and cmp["lookahead_matches_host_loop"]
        results["models"][model] = {"comparison": cmp, "single_stage_charges": rows1, "two_stage_charges": rows2,
                                    "tokens": single.tokens}
        print(f"{model}: bit_identical={cmp['bit_identical']} { {k: v for k, v in cmp.items() if k != 'lookahead_tokens'} }")
        for r in rows1 + rows2:
            print(f"  {r['device']} blocks {r['blocks']}: planned resident {r['planned_resident_bytes'] / 1e9:.3f} GB"
                  f" measured {r['measured_resident_bytes'] / 1e9:.3f} GB"
                  f" (ratio {r['resident_ratio_planned_over_measured']:.4f}); workspace planned"
                  f" {r['planned_workspace_bytes'] / 1e9:.3f} GB, prefill peak {r['measured_prefill_peak_bytes'] / 1e9:.3f} GB")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0 if all(m["comparison"]["bit_identical"] for m in results["models"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
