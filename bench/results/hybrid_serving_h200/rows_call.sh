#!/usr/bin/env bash
# Session 11's last call, run in session 12 (issue 44): the GPU tile-counter test after its device-key fix; the
# packed kernels' GPU tests after kernel A's rework (helper commits ad99430..e696136);
# rows_logprobs.py with graphs (random Qwen3.6 Q8_0 on the device); decode tok/s at 1/2/4/8/16 streams with dense Q8_0
# matmuls of more rows than a threshold (16 today, 1) through the few-rows tensor-core GEMM instead of the GEMV
# (gemv_gemm_ab.py); whether the first 8-stream burst after warm-up compiles or captures anything in the engine
# (issue 47: over HTTP the first burst's TTFT was 1.34 s against 0.15 s, every later burst as fast as its second
# pass; warm_up_check.py, 216-token prompts as the chat template makes them, 16 rows to keep its mixed burst short);
# where an 8-stream decode step's time goes (profile_batch.py).
# In that order, each part only if it can end by DEADLINE_S (default 560) seconds. Carry [".wheels"], timeout 600;
# everything lands in $OUT.
set -u
source bench/device_steps.sh
steps_setup /tmp/rows
H=bench/results/hybrid_serving_h200
# the committed code only (a helper may be editing kernels in the working tree this copy came from)
if git diff --quiet HEAD -- stagewise tests 2>/dev/null; then stamp "tree = $(git log -1 --format=%h)"
else git checkout HEAD -- stagewise tests && stamp "tree = $(git log -1 --format=%h) (working-tree edits set aside)"; fi
step tile_test 20 && { timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider -o addopts="" tests/test_tile_counters.py \
  > "$O/gpu_test_tile_counters.txt" 2>&1; tail -n 1 "$O/gpu_test_tile_counters.txt"; }
step packed_gpu_tests 100 && { timeout 100 python3 -m pytest -q -rfE -p no:cacheprovider -o addopts="" -m gpu \
  tests/test_packed_decode.py tests/test_packed_gemm.py > "$O/gpu_tests_packed_kernels.txt" 2>&1; tail -n 3 "$O/gpu_tests_packed_kernels.txt"; }
for g in 16 1; do
  step "gemv_max_$g" 90 && timeout 110 python3 $H/gemv_gemm_ab.py random:qwen3.6-35b-a3b@q8_0 --gemv-max $g \
    2>&1 | grep gemv_max | tee -a "$O/gemv_gemm_ab.jsonl"
done
step first_burst 110 && timeout 120 python3 bench/warm_up_check.py random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 \
  --context 4096 --max-seqs 16 --bursts 8,8 --prompt 216 --gen 16 --json "$O/warm_up_check_qwen36_q8.json" \
  2>&1 | grep -v Warning | tail -8
for run in graphs; do
  step "rows_$run" 70 || continue
  GRAPHS=$([ $run = graphs ] && echo 1 || echo 0) timeout 110 python3 $H/rows_logprobs.py > "$O/rows_logprobs_$run.txt" 2>&1
  grep rows "$O/rows_logprobs_$run.txt" | cut -c1-160
done
step profile_8_streams 70 && timeout 110 python3 bench/profile_batch.py random:qwen3.6-35b-a3b@q8_0 --streams 8 \
  --json "$O/profile_batch_qwen36_q8_8.json" 2>&1 | grep -v Warning | head -n 22
cp "$R/log.txt" "$O/log.txt"; stamp done
