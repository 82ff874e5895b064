#!/usr/bin/env bash
# Call 3 of 3 (one H200, call 1's warm machine for build/lb; about 8 min, estimated): make-model writes
# Qwen3.6-35B-A3B Q8_0 (random weights; Q8_0 bytes as gguf.quants', llama.cpp's), then run.sh: stagewise serve,
# then llama-server, at 1/8/32/64 streams (each loads the 37 GB file).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=build/lb; W=/tmp/w; mkdir -p $W
[ -x $B/bin/llama-server ] || { echo "call3.sh: $B/bin/llama-server missing: run call1.sh on this machine first" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
F=$W/qwen3.6-35b-a3b-Q8_0.gguf
stamp "make-model qwen3.6-35b-a3b q8_0"
[ -f $F ] || timeout 200 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /dev/null
ls -l $F; stamp written
LIMIT_S=$(( 560 - ($(date +%s) - t0) )) bash bench/results/serve_peer_h200/run.sh $B $F qwen3.6-35b-a3b-Q8_0
stamp done
