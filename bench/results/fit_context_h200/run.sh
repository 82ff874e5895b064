#!/usr/bin/env bash
# Issue 46 on one H200 (about 5 min): the load check's measured peak against the certified charge.
#  1. Qwen3.6-35B-A3B (random weights, Q4_K) as `serve` loads it on the seed's budget (cuda:0@22.76GB,
#     --context 32768, --max-seqs auto): warm-up with the full-context step, then a 30,000-token prompt and
#     256 generated tokens; per stage weights / state / workspace planned vs measured, certified total vs
#     torch.cuda.max_memory_allocated (target: peak <= charge, >= 0.9 of it).
#  2. The same with --kv-dtype fp8 at --context 65536 (one sequence): a 60,000-token prompt.
#  3. The GPU-marked tests of the load check and fp8 KV (tiny models: peak within the charge, fp8 greedy
#     tokens equal bf16's on the Triton path).
#  4. No speed regression: the single-stream benches of bench_qwen36_q8_1gpu.json and bench_llama8b_1gpu.json,
#     same commands (before: Qwen3.6 Q8_0 prefill 7,763 / decode 411.4 tok/s; Llama-3.1-8B 40,921 / 240.4).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp "1. qwen3.6 q4_k on cuda:0@22.76GB, context 32768, max-seqs auto: 30,000-token prompt + 256"
timeout 150 python3 bench/fit_context_check.py random:qwen3.6-35b-a3b@q4_k --devices cuda:0@22.76GB --context 32768 \
  --prompt 30000 --gen 256 --json "$O/qwen36_q4k_22.76GB_ctx32768.json" 2>&1 | grep -v Warning | tail -24
stamp "2. the same, fp8 KV at context 65536, one sequence: 60,000-token prompt + 64"
timeout 75 python3 bench/fit_context_check.py random:qwen3.6-35b-a3b@q4_k --devices cuda:0@22.76GB --context 65536 \
  --kv-dtype fp8 --max-seqs 1 --prompt 60000 --gen 64 --json "$O/qwen36_q4k_22.76GB_fp8_ctx65536.json" 2>&1 \
  | grep -v Warning | tail -24
stamp "3. GPU-marked tests"
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_peak_check.py tests/test_fp8_kv.py 2>&1 | tail -12
stamp "4. speed, as before"
timeout 70 python3 -m stagewise bench random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 --placement single --prompt 2048 \
  --gen 128 --repeats 3 --json > "$O/bench_qwen36_q8_1gpu.json" 2> "$O/bench_qwen36.err" || tail -5 "$O/bench_qwen36.err"
timeout 50 python3 -m stagewise bench random:llama-3.1-8b --json --devices cuda:0 --placement single --prompt 512 \
  --gen 128 --repeats 3 > "$O/bench_llama8b_1gpu.json" 2> "$O/bench_llama8b.err" || tail -5 "$O/bench_llama8b.err"
for f in "$O"/bench_qwen36_q8_1gpu.json "$O"/bench_llama8b_1gpu.json; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print(sys.argv[1].split('/')[-1], {k: round(s[k], 1) for k in ('prefill_tokens_per_s','decode_tokens_per_s')})" "$f" 2>/dev/null
done
stamp done
