#!/usr/bin/env bash
# The GPU measurements of docs/performance.md and docs/qualification.md, in one pass on nvidia-h200-x2.
# Usage (repository root, PYTHONPATH=. or installed): bash bench/h200_suite.sh OUTDIR
set -u
OUT=${1:?output directory}
B="python3 -m stagewise bench"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp kernel tests; timeout 90 python3 -m pytest tests/test_triton_kernels.py tests/test_moe_grouped_triton.py -q -p no:cacheprovider 2>&1 | tail -3
stamp exactness; timeout 80 python3 bench/gpu_exact.py random:llama-3.1-8b random:qwen3.5-4b --out "$OUT/gpu_exact_2xh200.json" 2>&1 | grep -E "bit_identical|planned"
stamp qualification; timeout 230 python3 bench/qualify_rfc.py --gguf /tmp/q36.gguf --out "$OUT/qualification_2xh200.json" | cut -c1-1500
stamp llama 1 gpu vs transformers; timeout 120 $B random:llama-3.1-8b --devices cuda:0 --placement single --prompt 2048 --gen 128 --repeats 2 --baseline transformers --json > "$OUT/bench_llama8b_1gpu.json"
stamp llama 2 gpus; timeout 60 $B random:llama-3.1-8b --devices cuda:0,cuda:1 --placement pipeline:2 --prompt 2048 --gen 128 --repeats 3 --json > "$OUT/bench_llama8b_2gpu.json"
stamp qwen3-30b 1 gpu; timeout 70 $B random:qwen3-30b-a3b@q8_0 --devices cuda:0 --placement single --prompt 2048 --gen 128 --repeats 2 --json > "$OUT/bench_qwen3_30b_q8_1gpu.json"
stamp qwen3-30b 2 gpus; timeout 70 $B random:qwen3-30b-a3b@q8_0 --devices cuda:0,cuda:1 --placement pipeline:2 --prompt 2048 --gen 128 --repeats 2 --json > "$OUT/bench_qwen3_30b_q8_2gpu.json"
stamp gemv graph sweep; timeout 200 python3 bench/gemv_graph.py --out "$OUT/gemv_graph_h200.json" | tail -22
stamp done
for f in "$OUT"/bench_*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['stagewise']; print(sys.argv[1].split('/')[-1], {k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','handoff_device_s_per_token','roofline_fraction')}, s['tokens_head'][:4], r.get('ratio_vs_transformers'))" "$f" || tail -c 800 "$f"
done
