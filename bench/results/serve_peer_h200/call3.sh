#!/usr/bin/env bash
# Call 3 of 3 (one H200, the warm machine of calls 1 and 2; about 6 min, estimated): run.sh on Qwen3.6-35B-A3B
# Q8_0: stagewise serve, then llama-server, at 1/8/32/64 streams, two passes (each loads the 37 GB file).
set -u
B=build/lb; Q=/tmp/w/qwen3.6-35b-a3b-Q8_0.gguf
[ -x $B/bin/llama-server ] && [ -f $Q ] || { echo "call3.sh: run call1.sh and call2.sh on this machine first" >&2; exit 2; }
LIMIT_S=560 bash bench/results/serve_peer_h200/run.sh $B $Q qwen3.6-35b-a3b-Q8_0
