#!/usr/bin/env bash
# Call 2 of 3 (one H200, call 1's warm machine; about 4 min, estimated): run.sh on Llama-3.1-8B Q4_K_M: stagewise
# serve, then llama-server, at 1/8/32/64 streams, two passes.
set -u
B=build/lb; F=/tmp/w/llama-3.1-8b-Q4_K_M.gguf
[ -x $B/bin/llama-server ] && [ -f $F ] || { echo "call2.sh: run call1.sh on this machine first" >&2; exit 2; }
LIMIT_S=540 bash bench/results/serve_peer_h200/run.sh $B $F llama-3.1-8b-Q4_K_M
