#!/usr/bin/env bash
# Round 2, call 2 (one H200): the slot-path GEMV (Q4_K/Q5_K) beside the byte path, and whole decodes.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp gemv tests
timeout 200 python3 -m pytest tests/test_packed_kernels.py -q -x -p no:cacheprovider -k "gemv" 2>&1 | tail -3
stamp gemv bench
timeout 260 python3 bench/packed_gemv.py --out "$O/packed_gemv_slots_h200.json" --types q4_k,q5_k,q6_k 2>&1 | grep -v "^$"
for m in llama-3.1-8b@q4_k llama-3.1-8b@q6_k qwen3-30b-a3b@q4_k; do
  stamp "bench $m"
  timeout 150 python3 -m stagewise bench "random:$m" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
    > "$O/bench2_${m//[@.-]/_}.json" 2> "$O/bench.err" || tail -5 "$O/bench.err"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/bench2_${m//[@.-]/_}.json"
done
stamp matmul bench
timeout 150 python3 bench/packed_matmul.py --out "$O/packed_matmul_h200.json" --types q4_k,q6_k 2>&1 | tail -40
stamp done
