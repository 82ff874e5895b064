#!/usr/bin/env bash
# Continuous-batching measurements of docs/performance.md, in one pass on nvidia-h200 (~9 minutes).
# Usage (repository root, PYTHONPATH=. or installed): bash bench/batch_suite.sh OUTDIR
# Writes the JSON files bench/results/README.md lists under "continuous batching"; each holds its command.
set -u
OUT=${1:?output directory}
B="python3 -m stagewise bench"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp GPU kernel and paged-KV tests
timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/test_paged_kv.py tests/test_triton_kernels.py \
  > "$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
stamp batched vs alone, two stages on two GPUs vs one when there are two, preemption
STAGED=$(python3 -c "import torch; print('--staged cuda:0,cuda:1' if torch.cuda.device_count() > 1 else '')")
timeout 80 python3 bench/batch_check.py random:tiny-llama random:tiny-qwen3.6 random:tiny-qwen3-moe --streams 8 --gen 32 \
  --devices cuda:0 $STAGED --json "$OUT/batch_check_h200.json" | cut -c1-300
timeout 50 python3 bench/batch_check.py random:tiny-llama random:tiny-qwen3.6 --streams 8 --gen 32 --devices cuda:0 \
  --kv-tokens 640 --json "$OUT/batch_check_preempt_h200.json" | cut -c1-300
stamp qwen3-30b concurrency
timeout 110 $B random:qwen3-30b-a3b@q8_0 --devices cuda:0 --placement single --concurrency 1,8,32,64 --prompt 128 \
  --gen 128 --repeats 1 --json > "$OUT/concurrency_qwen3_30b_q8_1gpu.json"
stamp llama concurrency
timeout 120 $B random:llama-3.1-8b --devices cuda:0 --placement single --concurrency 1,8,32,64 --prompt 128 --gen 128 \
  --repeats 1 --json > "$OUT/concurrency_llama8b_1gpu.json"
stamp llama single stream
timeout 45 $B random:llama-3.1-8b --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 3 --json \
  > "$OUT/bench_llama8b_1gpu_batching_build.json"
stamp done
for f in "$OUT"/concurrency_*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1]); [print(l['streams'], round(l['decode_tokens_per_s']), round(l['aggregate_tokens_per_s']), round(l['ttft_s_max'], 3)) for l in r.get('levels', [])]" "$f" || tail -c 600 "$f"
done
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print('single stream', s['decode_tokens_per_s'])" "$OUT/bench_llama8b_1gpu_batching_build.json" || true
