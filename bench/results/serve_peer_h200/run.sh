#!/usr/bin/env bash
# stagewise serve beside llama-server on one H200, over HTTP with one client (issue 47): bench/serve_load.py
# --peer at 1/8/32/64 streams, two passes (the first is each server's first burst after ready), fresh prompts
# per burst (no prefix-cache hits on either side), streamed chat completions, 208-token prompts, 128 tokens
# out (ignore_eos), tokens counted from the usage chunk. Ours runs first and stops; then llama-server on the
# same GGUF. One table: both servers and stagewise / llama-server (output tok/s, TTFT and ITL p50/p99).
#
# Usage (repository root):
#   bash bench/results/serve_peer_h200/run.sh LLAMA_BUILD GGUF NAME
#   LLAMA_BUILD  a llama.cpp build holding bin/llama-server (llama-server target of
#                ../shared/tools/llamacpp-source.sh's CUDA build line, e.g. into build/lb, kept between calls)
#   GGUF         the model file both servers load
#   NAME         names the output: $OUT/serve_peer_NAME.json (and .txt, the table)
# Environment (defaults for one H200): DEVICES=cuda:0 MAX_SEQS=64 CTX=4096 LEVELS=1,8,32,64 PROMPT=208 GEN=128
#   PASSES=2 LLAMA_ARGS="-ngl 99 -fa on" (llama-server also gets -np MAX_SEQS -c MAX_SEQS*CTX), LIMIT_S=420.
# The two files of the issue, made on the device machine (about 2 and 3 min):
#   python3 -m stagewise make-model --config llama-3.1-8b --dtype f16 --device cuda /tmp/w/l8-f16.gguf && \
#     build/lb/bin/llama-quantize /tmp/w/l8-f16.gguf /tmp/w/llama-3.1-8b-Q4_K_M.gguf Q4_K_M 16 && rm /tmp/w/l8-f16.gguf
#   python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --device cuda /tmp/w/qwen3.6-35b-a3b-Q8_0.gguf
# Each run takes about 3-4 min (8B Q4_K_M) and 5-6 min (Qwen3.6 Q8_0: two loads of 37 GB), estimated.
# call1.sh, call2.sh and call3.sh do it all in three calls of one warm machine (build and file, runs).
set -u
BUILD=${1:?llama.cpp build directory (bin/llama-server)}; GGUF=${2:?GGUF file}; NAME=${3:?output name}
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
SERVER="$BUILD/bin/llama-server"
[ -x "$SERVER" ] || { echo "run.sh: $SERVER not found (build the llama-server target)" >&2; exit 2; }
[ -f "$GGUF" ] || { echo "run.sh: $GGUF not found" >&2; exit 2; }
if [[ ":${PYTHONPATH:-}:" == *:/tmp/site:* ]]; then
  :  # the caller installed them (call1.sh, call2.sh)
elif ls .wheels/*.whl > /dev/null 2>&1; then  # the device machine's extra packages, as the other run scripts
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
PY=${PYTHON:-python3}
DEVICES=${DEVICES:-cuda:0}; MAX_SEQS=${MAX_SEQS:-64}; CTX=${CTX:-4096}
LEVELS=${LEVELS:-1,8,32,64}; PROMPT=${PROMPT:-208}; GEN=${GEN:-128}; PASSES=${PASSES:-2}
LLAMA_ARGS=${LLAMA_ARGS:--ngl 99 -fa on}
stamp "serve_load $NAME: stagewise, then llama-server ($(basename "$GGUF"))"
timeout "${LIMIT_S:-420}" "$PY" bench/serve_load.py "$GGUF" --devices "$DEVICES" --placement single \
  --max-seqs "$MAX_SEQS" --context "$CTX" --concurrency "$LEVELS" --prompt "$PROMPT" --gen "$GEN" \
  --passes "$PASSES" --fresh-prompts --startup-timeout-s 300 \
  --peer "$SERVER $LLAMA_ARGS -np $MAX_SEQS -c $(( MAX_SEQS * CTX ))" --peer-name llama-server \
  --json "$O/serve_peer_$NAME.json" > "$O/serve_peer_$NAME.txt" 2>&1
rc=$?
grep -v "^burst .*completed" "$O/serve_peer_$NAME.txt" | tail -24
stamp "done (rc $rc)"
exit $rc
