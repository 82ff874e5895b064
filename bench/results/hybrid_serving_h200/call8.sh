#!/usr/bin/env bash
# Call 8 (one GPU, < 5 min; 2026-12-06): issue 44's served figures where the device time left no make-model file:
# random:qwen3.6-35b-a3b@q8_0 (the same geometry and Q8_0 weights drawn on the device, the demo tokenizer),
# `stagewise serve --max-seqs 64 --context 4096`, two passes of 8/32/64 streams (208-token prompts, 128 out, fresh
# prompts a burst, chat, tokens from the usage chunk). Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
stamp "two passes, 8/32/64 streams"
timeout ${LIMIT_S:-280} python3 bench/serve_load.py random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 --placement single \
  --max-seqs 64 --context 4096 --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat \
  --no-in-process --startup-timeout-s 150 --json $O/serve_two_passes_call8_qwen36_q8_random.json > $O/serve_two_passes_call8.txt 2>&1
grep -v "^burst .*completed" $O/serve_two_passes_call8.txt | tail -16
stamp done
