#!/usr/bin/env bash
# Call 2 of 3 (one H200, ~9 min; after call1.sh on the same warm machine): Qwen3.6-35B-A3B Q8_0, same file.
# In process: `stagewise bench --concurrency 1,8,32,64 --prompt 128 --gen 128` (aggregate with prefill, and
# the single stream) beside llama-batched-bench -npp 128 -ntg 128 -npl 1,8,32,64; over HTTP:
# bench/serve_load.py, stagewise serve then llama-server -np 64 -fa on on the same file, one client, 8/32/64
# streams, 208-token prompts, 128 out, streamed chat, tokens from the usage chunk, fresh prompts per burst.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=build/lb; F=/tmp/w/qwen3.6-35b-a3b-Q8_0.gguf
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
while [ ! -f /tmp/build.rc -o ! -f /tmp/make_model.rc ] && [ $(( $(date +%s) - t0 )) -lt 240 ]; do sleep 5; done
ls -l $F $B/bin/llama-server $B/bin/llama-batched-bench || exit 1
stamp "in process: stagewise bench --concurrency (file)"
timeout 200 python3 -m stagewise bench $F --devices cuda:0 --placement single --concurrency 1,8,32,64 \
  --prompt 128 --gen 128 --repeats 2 --json > "$O/bench_concurrency_qwen36_q8_h200.json" 2> /tmp/bench.err; tail -3 /tmp/bench.err
python3 - "$O/bench_concurrency_qwen36_q8_h200.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])).get("levels", []): print({k: r[k] for k in r if not isinstance(r[k], (list, dict))})
PY
stamp "llama-batched-bench"
timeout 120 $B/bin/llama-batched-bench -m $F -c 17408 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on \
  > "$O/llama_batched_bench_qwen36_q8_h200.txt" 2>&1; grep -E "^\|" "$O/llama_batched_bench_qwen36_q8_h200.txt" | tail -6
stamp "serve_load: stagewise serve, then llama-server"
timeout 330 python3 bench/serve_load.py $F --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
  --concurrency 8,32,64 --prompt 208 --gen 128 --passes 1 --fresh-prompts --endpoint chat --no-in-process \
  --startup-timeout-s 240 --peer "$B/bin/llama-server -ngl 99 -fa on -np 64 -c 262144" --peer-name llama-server \
  --json "$O/serve_peer_qwen36_q8_h200.json" > "$O/serve_peer_qwen36_q8_h200.txt" 2>&1
grep -v "^burst .*completed" "$O/serve_peer_qwen36_q8_h200.txt" | tail -24
stamp done
