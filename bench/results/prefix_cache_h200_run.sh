#!/usr/bin/env bash
# One H200: the prefix-cache benchmark over HTTP (#33), Llama-3.1-8B bf16 random weights, cache on and off.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
timeout 185 python3 bench/prefix_cache_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 32 \
  --vocab 32000 --gen 64 --json "$O/prefix_cache_llama8b_h200.json" 2>&1 | tail -12
