#!/usr/bin/env bash
# Issue 44, one call (< 5 min, one GPU). nan_call2 (nan_warmup_h100/call2/): serve warms up with --no-peak-check and
# with --no-cuda-graphs; in process the full-context step after the warm-up passes with graphs, without pieces,
# without graphs: but that script synchronized and scanned after every iteration. Is it a race the
# synchronization hides? serve with CUDA_LAUNCH_BLOCKING=1, then in process with SCAN=0 (no synchronization),
# with and without the packed graph pieces, and without graphs. Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
M=random:qwen3.6-35b-a3b@q8_0
warm() {  # warm NAME ARGS...: serve until warmed up or an error (at most 85 s)
  local name=$1; shift; stamp "serve $name"
  timeout 85 python3 -m stagewise serve $M --devices cuda:0 --placement single --max-seqs 8 --context 4096 \
    --port $((18000 + RANDOM % 1000)) "$@" > "$O/serve_$name.txt" 2>&1 &
  local pid=$! i
  for i in $(seq 85); do sleep 1; grep -q -E "warmed up|error" "$O/serve_$name.txt" && break; kill -0 $pid 2>/dev/null || break; done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep -E "warmed up|error" "$O/serve_$name.txt" | head -2
}
P=bench/results/hybrid_serving_h200/nan_full_context.py
run() {  # run NAME ENV...: nan_full_context.py in process
  local name=$1; shift; stamp "in process, $name"
  env "$@" timeout 80 python3 $P > "$O/full_context_$name.txt" 2>&1; grep -v Warn "$O/full_context_$name.txt" | grep -E "error|done|nonfinite\": \{\"" | cut -c1-600 | tail -4
}
run noscan SCAN=0
run noscan_nopieces SCAN=0 PIECES=0
run noscan_nographs SCAN=0 GRAPHS=0
CUDA_LAUNCH_BLOCKING=1 warm launch_blocking
stamp done
