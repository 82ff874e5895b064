#!/usr/bin/env bash
# Round 3, call 1 (one H200): the status page polled beside unpolled runs at 64 streams (#34, 3 A B B A
# rounds); Q4_K/Q5_K GEMV with exact float conversion and one FMA a value, 8- and 16-byte slots (#29);
# the whole 8B Q4_K decode with it.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp serve_load status A/B
timeout 230 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 64 \
  --concurrency 64 --prompt 208 --gen 256 --status-poll-s 1 --status-rounds 3 --no-in-process \
  --json "$O/serve_status_ab_llama8b_h200.json" 2>&1 | tail -16
stamp packed_gemv
timeout 200 python3 bench/packed_gemv.py --types q4_k,q5_k --out "$O/packed_gemv_exactf32_h200.json" 2>&1 | grep -v Warning | tail -12
stamp bench 8b q4_k
timeout 130 python3 -m stagewise bench random:llama-3.1-8b@q4_k --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
  > "$O/bench1_llama_3_1_8b_q4_k.json" 2> "$O/bench.err" || tail -5 "$O/bench.err"
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/bench1_llama_3_1_8b_q4_k.json"
stamp done
