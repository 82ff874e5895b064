"""One-off (issue 44, session 15, for the next device call): an 8-stream Qwen3.6 Q8_0 decode step spends 3.6 of its
7.0 ms in the routed experts' per-slot Q8_0 GEMV (64 slots a layer, one GEMV program set per slot; 2.5 ms of bytes
on an H100). Up to ``experts.GATHER_MAX_SLOTS`` (64, set on 2026-11-30, before the grouped decode kernels with
fused SiLU·up existed) routed slots take that GEMV; more take the grouped decode GEMM, which reads each routed
expert once for all its slots. This runs `bench_concurrency` with the threshold patched to ``--gather-max``
(8: one token's slots gather, 2+ tokens take the grouped kernels), one value per process:

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/session15/gather_ab.py MODEL --gather-max 8
"""
import argparse
import json
import sys

sys.path.insert(0, ".")
import stagewise.models.layers.experts as experts
from stagewise.engine.concurrency_bench import bench_concurrency
from stagewise.engine.model_loading import load_model

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--gather-max", type=int, required=True)
p.add_argument("--levels", default="1,2,4,8,16")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--gen", type=int, default=128)
args = p.parse_args()
experts.GATHER_MAX_SLOTS = args.gather_max
levels = [int(x) for x in args.levels.split(",")]
loaded = load_model(args.model, "cuda:0", "single", args.prompt + args.gen + 8, max_seqs=max(levels))
rows = bench_concurrency(loaded, levels, args.prompt, args.gen, repeats=2)
for r in rows:
    print(json.dumps({"gather_max": args.gather_max, "streams": r["streams"],
                      "decode_tok_s": round(r["decode_tokens_per_s"], 1),
                      "total_tok_s": round((args.prompt + args.gen) * r["streams"] / r["wall_s"], 1),
                      "ttft_s": round(r["ttft_s_median"], 4)}), flush=True)
