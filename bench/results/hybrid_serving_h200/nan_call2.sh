#!/usr/bin/env bash
# Issue 44, one call (< 10 min, one GPU): narrow serve's warm-up failure on Qwen3.6 with the prefix cache
# (nan_warmup_h100/): serve with --no-peak-check and with --no-cuda-graphs (prefix cache on), then
# nan_full_context.py in process: with graphs, without packed pieces, without graphs, the full-context step first.
# Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
M=random:qwen3.6-35b-a3b@q8_0
warm() {  # warm NAME ARGS...: serve until warmed up or an error (at most 100 s)
  local name=$1; shift; stamp "serve $name"
  timeout 85 python3 -m stagewise serve $M --devices cuda:0 --placement single --max-seqs 8 --context 4096 \
    --port $((18000 + RANDOM % 1000)) "$@" > "$O/serve_$name.txt" 2>&1 &
  local pid=$! i
  for i in $(seq 85); do sleep 1; grep -q -E "warmed up|error" "$O/serve_$name.txt" && break; kill -0 $pid 2>/dev/null || break; done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep -E "warmed up|error" "$O/serve_$name.txt" | head -2
}
warm no_peak_check --no-peak-check
warm no_cuda_graphs --no-cuda-graphs
P=bench/results/hybrid_serving_h200/nan_full_context.py
stamp "in process, graphs";  timeout 95 python3 $P > $O/full_context_graphs.txt 2>&1; grep -v Warn $O/full_context_graphs.txt | tail -12
stamp "in process, no packed pieces"; PIECES=0 timeout 95 python3 $P > $O/full_context_nopieces.txt 2>&1; grep -v Warn $O/full_context_nopieces.txt | tail -6
stamp "in process, no graphs"; GRAPHS=0 timeout 95 python3 $P > $O/full_context_nographs.txt 2>&1; grep -v Warn $O/full_context_nographs.txt | tail -6
stamp "in process, full-context first"; FULL_FIRST=1 timeout 90 python3 $P > $O/full_context_first.txt 2>&1; grep -v Warn $O/full_context_first.txt | tail -6
stamp done
