#!/usr/bin/env bash
# Round 2, call 3 (one H200): whole decodes and prefills with the per-type GEMV configs and the
# dequantized-tile prefill matmul (86c0eec).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
for m in llama-3.1-8b@q4_k llama-3.1-8b@q6_k llama-3.1-8b@q8_0 qwen3-30b-a3b@q4_k; do
  stamp "bench $m"
  timeout 150 python3 -m stagewise bench "random:$m" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
    > "$O/bench3_${m//[@.-]/_}.json" 2> "$O/bench.err" || tail -5 "$O/bench.err"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/bench3_${m//[@.-]/_}.json"
done
stamp "concurrency llama-3.1-8b@q4_k"
timeout 150 python3 -m stagewise bench random:llama-3.1-8b@q4_k --devices cuda:0 --placement single --concurrency 1,32 --prompt 128 --gen 128 --repeats 1 --json \
  > "$O/bench3_concurrency_llama_q4_k.json" 2> "$O/conc.err" || tail -5 "$O/conc.err"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps(r)[:1500])" "$O/bench3_concurrency_llama_q4_k.json"
stamp done
