#!/usr/bin/env bash
# Session 11's last call (issue 44): the GPU tile-counter test after its device-key fix, and rows_logprobs.py with
# graphs, without graphs, and with graphs and STAGEWISE_PDL=0 (random Qwen3.6 Q8_0 on the device). Carry [".wheels"].
set -u
source bench/device_steps.sh
steps_setup /tmp/rows
H=bench/results/hybrid_serving_h200
timeout 60 python3 -m pytest -q -rfE -p no:cacheprovider -o addopts="" tests/test_tile_counters.py > "$O/gpu_test_tile_counters.txt" 2>&1
tail -n 1 "$O/gpu_test_tile_counters.txt"
for run in graphs eager graphs_pdl0; do
  stamp "$run"
  case $run in eager) export GRAPHS=0;; graphs_pdl0) export GRAPHS=1 STAGEWISE_PDL=0;; *) export GRAPHS=1;; esac
  timeout 120 python3 $H/rows_logprobs.py > "$O/rows_logprobs_$run.txt" 2>&1
  grep rows "$O/rows_logprobs_$run.txt" | cut -c1-150
done
stamp done
