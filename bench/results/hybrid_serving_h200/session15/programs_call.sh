#!/usr/bin/env bash
# Session 15: programs_ab.py at DENSE_MIN_PROGRAMS 0 (today), 264, 528, 1056 on random Qwen3.6-35B-A3B Q8_0 (carry .wheels).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$O/machine.txt"
for m in ${MINS:-0 528 264 1056}; do
  timeout 130 python3 bench/results/hybrid_serving_h200/session15/programs_ab.py random:qwen3.6-35b-a3b@q8_0 --min-programs $m \
    2>&1 | grep min_programs | tee -a "$O/programs_ab.jsonl"
done
