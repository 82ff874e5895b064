"""One-off (issue 44, session 15): Qwen3.6 Q8_0 decodes 1,069 tok/s at 8 streams on an H200 (7.5 ms a step against
2.4 ms at one row). At 8 rows the few-rows Q8_0 GEMM splits K until a launch has 8 programs a row: 64 programs on
132 SMs for the 2048-output matrices (attention and linear-attention out projections, the shared expert's gate/up
and down), half the device idle. This runs `bench_concurrency` with `q8_0_gemm.DENSE_MIN_PROGRAMS` patched to
``--min-programs`` (a floor on the launch's programs, K split further; 0: today), one value per process:

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/session15/programs_ab.py MODEL --min-programs 256
"""
import argparse
import json
import sys

sys.path.insert(0, ".")
import stagewise.kernels.q8_0_gemm as q8_0_gemm
import stagewise.weights.quant.q8_0 as q8_0
from stagewise.engine.concurrency_bench import bench_concurrency
from stagewise.engine.model_loading import load_model

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--min-programs", type=int, required=True)
p.add_argument("--gemv-max", type=int, default=q8_0.GEMV_MAX_TOKENS)
p.add_argument("--levels", default="1,2,4,8,16,32")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--gen", type=int, default=128)
args = p.parse_args()
q8_0_gemm.DENSE_MIN_PROGRAMS = args.min_programs
q8_0_gemm.decode_tiles.cache_clear()
q8_0.GEMV_MAX_TOKENS = args.gemv_max
levels = [int(x) for x in args.levels.split(",")]
loaded = load_model(args.model, "cuda:0", "single", args.prompt + args.gen + 8, max_seqs=max(levels))
rows = bench_concurrency(loaded, levels, args.prompt, args.gen, repeats=2)
for r in rows:
    print(json.dumps({"min_programs": args.min_programs, "gemv_max": args.gemv_max, "streams": r["streams"],
                      "decode_tok_s": round(r["decode_tokens_per_s"], 1),
                      "total_tok_s": round((args.prompt + args.gen) * r["streams"] / r["wall_s"], 1),
                      "ttft_s": round(r["ttft_s_median"], 4)}), flush=True)
