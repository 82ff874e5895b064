#!/usr/bin/env bash
# Call 3 of 3 (one H200, ~7 min; after call2.sh on the same warm machine): the prefix cache for the hybrid
# over HTTP, Qwen3.6-35B-A3B Q8_0 (the same file): bench/prefix_cache_load.py, a server with the cache on
# then one with --no-prefix-cache: a 4,000-token system prompt shared by 16 agents at once, and a 10-turn
# chat after a 1,500-token system prompt; TTFT p50/p99 and the server's hit counters.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
F=/tmp/w/qwen3.6-35b-a3b-Q8_0.gguf
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
ls -l $F || exit 1
stamp "prefix_cache_load (cache on, then off)"
timeout 420 python3 bench/prefix_cache_load.py $F --devices cuda:0 --placement single --max-seqs 16 --context 8192 \
  --vocab 32000 --agents 16 --agent-system 4000 --chat-system 1500 --turns 10 --question 200 --gen 32 \
  --json "$O/prefix_cache_qwen36_q8_h200.json" 2>&1 | tail -16
stamp done
