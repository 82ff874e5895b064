#!/usr/bin/env bash
# Issue 44, one call (< 4 min). nan_call3: serve's full-context step fails unless CUDA_LAUNCH_BLOCKING=1; the
# step through a bare Batcher in process passes. nan_engine.py: serve's settings, loader and Engine in process
# (with PeakMeter, then without), then serve again as the control. Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
P=bench/results/hybrid_serving_h200/nan_engine.py
stamp "engine in process"; timeout 100 python3 $P > $O/engine.txt 2>&1; grep -E "warm-up|round|step|Error" $O/engine.txt | cut -c1-300
stamp "engine in process, METER=0"; METER=0 timeout 80 python3 $P > $O/engine_nometer.txt 2>&1; grep -E "warm-up|round|step|Error" $O/engine_nometer.txt | cut -c1-300
stamp "serve (control)"
timeout 80 python3 -m stagewise serve random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 --placement single --max-seqs 8 \
  --context 4096 --port 18123 > "$O/serve_control.txt" 2>&1 &
pid=$!; for i in $(seq 80); do sleep 1; grep -q -E "warmed up|error" "$O/serve_control.txt" && break; done
kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep -E "warmed up|error" "$O/serve_control.txt" | head -2
stamp done
