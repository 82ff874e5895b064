#!/usr/bin/env bash
# Issue 44, one call (< 4 min). call8: serve --max-seqs 64 fails its warm-up ("non-finite logits") while --max-seqs 8
# passed this session. nan_engine.py in process at 64 rows: as serve, with CUDA_LAUNCH_BLOCKING=1, without the prefix
# cache. Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
P=bench/results/hybrid_serving_h200/nan_engine.py
one() { local name=$1; shift; stamp "$name"; env "$@" ROUNDS=2 timeout 75 python3 $P > $O/engine64_$name.txt 2>&1
  grep -E "warm-up|round|step|File \"/.*stagewise" $O/engine64_$name.txt | cut -c1-200 | tail -12; }
one serve_like ARGS="--max-seqs 64"
one launch_blocking ARGS="--max-seqs 64" CUDA_LAUNCH_BLOCKING=1
one no_prefix ARGS="--max-seqs 64 --no-prefix-cache"
stamp done
