"""One-off (issue 44, session 11): Qwen3.6 Q8_0 decodes 668 tok/s at 8 streams on an H100 (12.0 ms a step, 2.6 ms
at one row, 14.0 ms at 32). Dense Q8_0 matmuls of up to ``GEMV_MAX_TOKENS`` (16) rows take the GEMV, which
converts every weight value once per row on the CUDA cores; from 17 rows they take the few-rows tensor-core GEMM
(split K). This runs `bench_concurrency` with the threshold patched to ``--gemv-max`` rows (4: rows 5-16 through
the GEMM, as the bf16 path's cuBLAS from 5 rows; 1: every step of 2+ rows), one value per process:

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/gemv_gemm_ab.py FILE --gemv-max 4 [--levels 1,2,4,8,16]
"""
import argparse
import json
import sys

sys.path.insert(0, ".")
import stagewise.weights.quant.q8_0 as q8_0
from stagewise.engine.concurrency_bench import bench_concurrency
from stagewise.engine.model_loading import load_model

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--gemv-max", type=int, required=True)
p.add_argument("--levels", default="1,2,4,8,16")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--gen", type=int, default=128)
args = p.parse_args()
q8_0.GEMV_MAX_TOKENS = args.gemv_max
levels = [int(x) for x in args.levels.split(",")]
loaded = load_model(args.model, "cuda:0", "single", args.prompt + args.gen + 8, max_seqs=max(levels))
rows = bench_concurrency(loaded, levels, args.prompt, args.gen, repeats=2)
for r in rows:
    print(json.dumps({"gemv_max": args.gemv_max, "streams": r["streams"],
                      "decode_tok_s": round(r["decode_tokens_per_s"], 1),
                      "total_tok_s": round((args.prompt + args.gen) * r["streams"] / r["wall_s"], 1),
                      "ttft_s": round(r["ttft_s_median"], 4)}), flush=True)
