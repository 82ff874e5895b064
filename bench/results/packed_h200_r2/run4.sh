#!/usr/bin/env bash
# Round 2, call 4 (one H200): packed-step GPU tests (#30), serving over HTTP with the status page polled
# (#30, #34), and the slot dequantizer / fused GEMM tiles (#29).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp packed-step tests
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_kernels.py -k packed tests/test_packed_steps.py 2>&1 | tail -3
stamp serve_load llama-3.1-8b
timeout 250 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 64 \
  --concurrency 1,8,32,64 --prompt 208 --gen 128 --status-poll-s 1 --json "$O/serve_load_llama8b_h200.json" 2>&1 | tail -25
stamp "bench llama-3.1-8b@q4_k"
timeout 60 python3 -m stagewise bench random:llama-3.1-8b@q4_k --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
  > "$O/bench4_llama_3_1_8b_q4_k.json" 2> "$O/bench.err" || tail -3 "$O/bench.err"
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/bench4_llama_3_1_8b_q4_k.json"
stamp packed_matmul
timeout 60 python3 bench/packed_matmul.py --out "$O/packed_matmul_slots_h200.json" --types q4_k 2>&1 | tail -18
stamp sweep-fused
timeout 80 python3 bench/packed_matmul.py --sweep-fused --out "$O/packed_gemm_tiles_h200.json" --types q4_k 2>&1 | tail -9
stamp done
