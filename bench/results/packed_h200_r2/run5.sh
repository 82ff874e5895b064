#!/usr/bin/env bash
# Round 2, call 5 (one H200): serving over HTTP with the status page polled (#30, #34, packed steps merged),
# and 8B Q4_K with the packed GEMM's tiles by rows (#29).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp serve_load llama-3.1-8b
timeout 160 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 64 \
  --concurrency 8,64 --prompt 208 --gen 128 --status-poll-s 1 --no-in-process --json "$O/serve_load_llama8b_h200.json" 2>&1 | tail -30
stamp done
