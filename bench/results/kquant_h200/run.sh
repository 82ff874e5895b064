#!/usr/bin/env bash
# Issue 45 (kquant-kernels), one H200, one call of 6-9 minutes (each step capped): (tests) the whole GPU test suite in one
# process, recorded as gpu_suite_h200.txt; (kernels) kernels A and B beside the kernels they replace and
# dense bf16, kernel A's tiles and its PTX conversion swept, MoE expert blocks against the grouped GEMM;
# (models) decode tok/s of random Q4_K models (Llama-3.1-8B, Qwen3.6-35B-A3B) at 1 / 8 / 32 / 64 streams (the table: Llama-3.1-8B
# Q4_K_M 191 / 231 / 900 / 1,898 before, llama.cpp 262 / 948 / 3,264 / 4,520).
# From the repository root with .wheels/ carried; steps may be named to run a part:
#   bash bench/results/kquant_h200/run.sh [tests] [kernels] [models]
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
decode() {  # decode tok/s per level of a `stagewise bench --concurrency --json` file
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(l['streams'], round(l['decode_tokens_per_s'])) for l in d['levels']])" "$1" "$2"
}
for step in ${*:-tests kernels models}; do
  case $step in
  tests)
    stamp "GPU test suite"
    cmd="python3 -m pytest -m gpu tests -p no:cacheprovider -q -rfE"
    { echo "\$ $cmd  # $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      timeout 170 $cmd 2>&1; echo "exit status $?"; } > "$O/gpu_suite_h200.txt"
    tail -15 "$O/gpu_suite_h200.txt" ;;
  kernels)
    stamp "kernels A and B (bench/packed_decode.py)"
    timeout 150 python3 bench/packed_decode.py --out "$O/packed_decode_h200.json" --types q4_k,q6_k --shapes gate/up,down \
      --sweep 2>&1 | tail -60 ;;
  models)
    for m in llama-3.1-8b@q4_k qwen3.6-35b-a3b@q4_k; do
      stamp "bench random:$m"
      f="$O/concurrency_${m//[@.-]/_}.json"
      timeout 100 python3 -m stagewise bench "random:$m" --devices cuda:0 --placement single --concurrency 1,8,32,64 \
        --prompt 128 --gen 64 --repeats 1 --json > "$f" 2> "$O/bench.err" && decode "$f" "$m" || tail -5 "$O/bench.err"
    done ;;
  esac
done
stamp done
