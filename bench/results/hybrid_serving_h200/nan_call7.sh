#!/usr/bin/env bash
# Issue 44, one call (< 3 min): nan_rows.py with graphs and without (which row counts fail). Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
P=bench/results/hybrid_serving_h200/nan_rows.py
stamp graphs; timeout 80 python3 $P > $O/rows_graphs.txt 2>&1; grep rows $O/rows_graphs.txt | cut -c1-160; tail -3 $O/rows_graphs.txt | cut -c1-300
stamp no graphs; GRAPHS=0 timeout 70 python3 $P > $O/rows_nographs.txt 2>&1; grep rows $O/rows_nographs.txt | cut -c1-160
stamp done
