"""One-off A/B (issue 44, session 15, for the next device call): decode at several stream counts with module
constants patched, one setting per process, e.g. the routed experts' gather threshold: an 8-stream Qwen3.6 Q8_0
step spends 3.6 of its 7.0 ms in the per-slot Q8_0 GEMV of up to ``experts.GATHER_MAX_SLOTS`` (64, set on
2026-11-30, before the grouped decode kernels with fused SiLU·up existed) routed slots; more take the grouped
decode GEMM, which reads each routed expert once for all its slots:

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/session15/constant_ab.py MODEL \\
        --set stagewise.models.layers.experts.GATHER_MAX_SLOTS=8 [--set MODULE.NAME=INT ...] [--levels 1,2,4,8,16]

A value ``types:Q4_K,Q5_K`` sets a frozenset of GGUF tensor types (e.g. ``packed_matmul.B_FROM_ONE_ROW``).
"""
import argparse
import functools
import importlib
import json
import sys

sys.path.insert(0, ".")
from stagewise.engine.concurrency_bench import bench_concurrency
from stagewise.engine.model_loading import load_model

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=INT|types:A,B")
p.add_argument("--levels", default="1,2,4,8,16")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--gen", type=int, default=128)
args = p.parse_args()
for setting in args.set:
    target, _, value = setting.partition("=")
    module, _, name = target.rpartition(".")
    if value.startswith("types:"):
        from gguf.constants import GGMLQuantizationType

        parsed: object = frozenset(GGMLQuantizationType[t] for t in value[len("types:"):].split(",") if t)
    else:
        parsed = int(value)
    setattr(importlib.import_module(module), name, parsed)
for module in ("stagewise.kernels.q8_0_gemm",):  # cached choices that read the constants
    for value in vars(importlib.import_module(module)).values():
        if isinstance(value, functools._lru_cache_wrapper):
            value.cache_clear()
levels = [int(x) for x in args.levels.split(",")]
loaded = load_model(args.model, "cuda:0", "single", args.prompt + args.gen + 8, max_seqs=max(levels))
rows = bench_concurrency(loaded, levels, args.prompt, args.gen, repeats=2)
for r in rows:
    print(json.dumps({"set": args.set, "streams": r["streams"], "decode_tok_s": round(r["decode_tokens_per_s"], 1),
                      "total_tok_s": round((args.prompt + args.gen) * r["streams"] / r["wall_s"], 1),
                      "ttft_s": round(r["ttft_s_median"], 4)}), flush=True)
