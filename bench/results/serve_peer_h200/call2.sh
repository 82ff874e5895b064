#!/usr/bin/env bash
# Call 2 of 3 (one H200, call 1's warm machine; about 7 min, estimated): run.sh on Llama-3.1-8B Q4_K_M (stagewise
# serve, then llama-server, at 1/8/32/64 streams, two passes), then make-model writes Qwen3.6-35B-A3B Q8_0 for
# call 3 (random weights; Q8_0 bytes as gguf.quants', llama.cpp's).
set -u
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=build/lb; W=/tmp/w; F=$W/llama-3.1-8b-Q4_K_M.gguf
[ -x $B/bin/llama-server ] && [ -f $F ] || { echo "call2.sh: run call1.sh on this machine first" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
LIMIT_S=330 bash bench/results/serve_peer_h200/run.sh $B $F llama-3.1-8b-Q4_K_M
Q=$W/qwen3.6-35b-a3b-Q8_0.gguf
stamp "make-model qwen3.6-35b-a3b q8_0"
[ -f $Q ] || timeout $(( 570 - ($(date +%s) - t0) )) python3 -m stagewise make-model --config qwen3.6-35b-a3b \
  --dtype q8_0 --seed 0 --device cuda $Q > /dev/null
ls -l $Q; stamp done
