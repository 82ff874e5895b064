#!/usr/bin/env bash
# Issue 44, one call (< 4 min): does 729dc19 (split-K counters made before any capture) fix what nan_call6/7 found?
# The GPU tests of the counters, nan_rows.py's history with graphs (17 rows failed), nan_engine.py at 64 rows
# (serve's warm-up failed). Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
stamp "tests/test_tile_counters.py on the GPU"
timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_tile_counters.py > $O/gpu_test_tile_counters.txt 2>&1; tail -2 $O/gpu_test_tile_counters.txt
stamp "nan_rows.py, graphs"
COUNTS=1,2,8,9,16,17,24,32,33,48,56,63,64 timeout 80 python3 bench/results/hybrid_serving_h200/nan_rows.py > $O/rows_fixed.txt 2>&1
grep rows $O/rows_fixed.txt | cut -c1-140
stamp "nan_engine.py --max-seqs 64"
ARGS="--max-seqs 64" ROUNDS=2 timeout 80 python3 bench/results/hybrid_serving_h200/nan_engine.py > $O/engine64_fixed.txt 2>&1
grep -E "warm-up|round|step" $O/engine64_fixed.txt | cut -c1-200
stamp done
