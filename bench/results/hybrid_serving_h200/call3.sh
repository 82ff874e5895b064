#!/usr/bin/env bash
# Call 3 of 3 (one H200, ~3 min; after call2.sh on the same warm machine, Qwen3.6-35B-A3B Q8_0, the same file):
# the prefix cache for the hybrid over HTTP (bench/prefix_cache_load.py: a server with the cache on, then one with
# --no-prefix-cache; 16 agents at once sharing a 4,000-token system prompt, and a 10-turn chat after a
# 1,500-token one), then stagewise serve alone for two passes of 8/32/64 streams (the first burst after ready and
# a warm one; fresh prompts per burst), as run (one command line, here split).
set -u
O=${OUT:-/tmp/out}; t0=$(date +%s)
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1; F=/tmp/w/qwen3.6-35b-a3b-Q8_0.gguf
echo "[0] prefix cache"
timeout 330 python3 bench/prefix_cache_load.py $F --devices cuda:0 --placement single --max-seqs 16 --context 8192 \
  --vocab 32000 --agents 16 --agent-system 4000 --chat-system 1500 --turns 10 --question 200 --gen 32 \
  --json $O/prefix_cache_qwen36_q8_h200.json 2>&1 | tail -14
echo "[$(( $(date +%s)-t0 ))] serve_load ours 2 passes"
timeout 230 python3 bench/serve_load.py $F --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
  --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat --no-in-process \
  --startup-timeout-s 200 --json $O/serve_two_passes_qwen36_q8_h200.json > $O/serve_two_passes_qwen36_q8_h200.txt 2>&1
grep -v "^burst .*completed" $O/serve_two_passes_qwen36_q8_h200.txt | tail -12
echo "[$(( $(date +%s)-t0 ))] done"
