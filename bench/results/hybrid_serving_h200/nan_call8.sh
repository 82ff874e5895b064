#!/usr/bin/env bash
# Issue 44, one call (< 4 min): nan_call7 found 17 decoding rows (the 24-row decode graph, 7 padding rows) failing
# after 1, 2, 8, 9, 16 rows had run, every row at its first decode step, with graphs only. Which history makes it
# fail (17 alone, after 24, after 16), and without padding rows (NOPAD=1: a 17-row graph); the pools' non-finite
# entries and the state table at the failure. Carry [".wheels"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
P=bench/results/hybrid_serving_h200/nan_rows.py
for c in 17 24,17 16,17 1,2,8,9,16,17; do stamp "counts $c"; COUNTS=$c timeout 50 python3 $P > $O/rows_$c.txt 2>&1; grep rows $O/rows_$c.txt | cut -c1-900; done
stamp "no padding rows"; NOPAD=1 COUNTS=1,2,8,9,16,17,24 timeout 50 python3 $P > $O/rows_nopad.txt 2>&1; grep rows $O/rows_nopad.txt | cut -c1-300
stamp done
