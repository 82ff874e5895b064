#!/usr/bin/env bash
# The few-rows Q8_0 kernels of batched decode, measured in one pass on nvidia-h200 (~9 minutes):
# their GPU tests, the tiles against the previous kernel, Qwen3-30B-A3B Q8_0 at 1-64 streams, 32 batched
# streams against alone (and two stages against one on two GPUs), and where a 32-stream step's time goes.
# Usage (repository root, PYTHONPATH=. or installed): bash bench/q8_0_decode_suite.sh OUTDIR
set -u
OUT=${1:?output directory}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp GPU tests of the decode kernels, the alignment and the paged kernels
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_moe_grouped_triton.py tests/test_triton_kernels.py \
  tests/test_paged_kv.py > "$OUT/gpu_tests_q8_0_decode_h200.txt" 2>&1; tail -2 "$OUT/gpu_tests_q8_0_decode_h200.txt"
stamp tiles: chosen vs the previous kernel
timeout 150 python3 bench/q8_0_decode_sweep.py --out "$OUT/q8_0_decode_chosen_h200.json" 2>&1 | grep -v "^timed" | tail -24
stamp qwen3-30b concurrency
timeout 130 python3 -m stagewise bench random:qwen3-30b-a3b@q8_0 --devices cuda:0 --placement single \
  --concurrency 1,8,32,64 --prompt 128 --gen 128 --repeats 1 --json > "$OUT/concurrency_qwen3_30b_q8_1gpu.json"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(l['streams'], round(l['decode_tokens_per_s']), round(l['aggregate_tokens_per_s']), round(l['ttft_s_max'], 3)) for l in r.get('levels', [])]" \
  "$OUT/concurrency_qwen3_30b_q8_1gpu.json" || tail -c 600 "$OUT/concurrency_qwen3_30b_q8_1gpu.json"
stamp "Qwen3-30B-A3B Q8_0: 32 batched vs alone; two stages on two GPUs vs one (torch.equal) when there are two"
STAGED=$(python3 -c "import torch; print('--staged cuda:0,cuda:1' if torch.cuda.device_count() > 1 else '')")
timeout 110 python3 bench/batch_check.py random:qwen3-30b-a3b@q8_0 --streams 32 --gen 16 --devices cuda:0 $STAGED \
  --json "$OUT/batch_check_qwen3_30b_q8_h200.json" | cut -c1-400
stamp profile at 32 streams
timeout 100 python3 bench/profile_batch.py random:qwen3-30b-a3b@q8_0 --streams 32 \
  --json "$OUT/profile_batch_qwen3_30b_q8_32.json" > /dev/null 2>&1
python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print(round(d['step_s'] * 1e3, 2), 'ms a step under the profiler')
[print(round(r['us_per_step'], 1), r['calls_per_step'], r['kernel'][:60]) for r in d['top'][:12]]" \
  "$OUT/profile_batch_qwen3_30b_q8_32.json" || true
stamp done
