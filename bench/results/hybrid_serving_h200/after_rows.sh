#!/usr/bin/env bash
# Session 12's second call (issues 44, 47, 48), after rows_call.sh on the same warm machine; no files to make:
#   qwen_inproc  random:qwen3.6-35b-a3b@q8_0 in process at 1/8/32/64 streams, 128-token prompts, 128 out (what
#                `stagewise bench --concurrency` runs) with the Q8_0 GEMV threshold GEMV_MAX (default 16) chosen from
#                rows_call.sh's A/B (single stream: the 425 tok/s baseline is an H200's; 8 streams: the
#                1.5x of llama-batched-bench's total, 1,411 tok/s on an H200 in the run);
#   llama_passes Llama-3.1-8B bf16 (random weights) served, two passes of 8/32/64 streams (208-token prompts, 128
#                out, fresh prompts, chat), then the same levels in process: issue 44's "no regression" (second
#                pass: 1,285 / 2,863 / 4,299 tok/s, TTFT p50 0.20 / 0.74 / 1.03 s before), issue 47's first burst
#                against the second, issue 48's HTTP >= 0.95x in process.
# Carry [".wheels"], timeout 600: GEMV_MAX=N DEADLINE_S=560 bash bench/results/hybrid_serving_h200/after_rows.sh
set -u
source bench/device_steps.sh
steps_setup /tmp/after_rows
H=bench/results/hybrid_serving_h200
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$O/machine.txt"
step qwen_inproc 200 && { timeout 200 python3 $H/gemv_gemm_ab.py random:qwen3.6-35b-a3b@q8_0 --gemv-max "${GEMV_MAX:-16}" \
  --levels 1,8,32,64 2>&1 | grep gemv_max | tee "$O/qwen36_q8_inproc_gemv_max_${GEMV_MAX:-16}.jsonl"; touch "$W/done/qwen_inproc"; }
step llama_passes 330 && { timeout 340 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single \
  --max-seqs 64 --context 4096 --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat \
  --startup-timeout-s 200 --bench-timeout-s 120 --json "$O/serve_two_passes_llama8b_bf16.json" \
  > "$O/serve_two_passes_llama8b_bf16.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_two_passes_llama8b_bf16.txt" | tail -16; touch "$W/done/llama_passes"; }
cp "$R/log.txt" "$O/log.txt"; stamp done
