#!/usr/bin/env bash
# Round 3, call 3 (one H200): llama.cpp (CUDA build of the vendored source) beside stagewise on the same
# Llama-3.1-8B Q4_K_M file, quantized by llama-quantize from a random-weight F16 make-model file:
# llama-bench pp512/tg128 and stagewise bench, assess's prediction beside the measured charge.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp "llama.cpp build, and the f16 file meanwhile"
( cmake -S .llamacpp -B build/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /tmp/cmake.log 2>&1 \
  && cmake --build build/lb -j 14 --target llama-bench llama-batched-bench llama-quantize llama-completion > /tmp/build.log 2>&1; echo "build rc $?" ) &
W=/tmp/w; mkdir -p $W
python3 -m stagewise make-model --config llama-3.1-8b --dtype f16 --seed 0 --device cuda "$W/llama-3.1-8b-f16.gguf" > /dev/null
stamp "f16 file written"; wait; stamp "built"
tail -3 /tmp/build.log
B=build/lb/bin
f=$W/llama-3.1-8b-Q4_K_M.gguf
$B/llama-quantize $W/llama-3.1-8b-f16.gguf $f Q4_K_M 16 > /tmp/q.log 2>&1 || tail -3 /tmp/q.log
rm -f $W/llama-3.1-8b-f16.gguf; ls -l $f; stamp quantized
$B/llama-bench -m $f -p 512 -n 128 -r 3 -ngl 99 -fa 1 -o json > "$O/llamabench_llama-3.1-8b_Q4_K_M.json" 2>/dev/null
python3 -c "import json,sys; [print('llama.cpp', r['n_prompt'], r['n_gen'], round(r['avg_ts'],1)) for r in json.load(open(sys.argv[1]))]" "$O/llamabench_llama-3.1-8b_Q4_K_M.json"
stamp "llama-bench done"
timeout 150 python3 -m stagewise bench $f --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
  > "$O/stagewise_llama-3.1-8b_Q4_K_M.json" 2> /tmp/bench.err || tail -5 /tmp/bench.err
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction','weights_bytes')})" "$O/stagewise_llama-3.1-8b_Q4_K_M.json"
python3 -m stagewise assess $f --devices cuda:0 --json > "$O/assess_llama-3.1-8b_Q4_K_M.json" 2>&1; tail -c 600 "$O/assess_llama-3.1-8b_Q4_K_M.json"
stamp "batched 1,32"
timeout 100 $B/llama-batched-bench -m $f -c 8192 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,32 -ngl 99 -fa on \
  --output-format jsonl > "$O/llamacpp_batched_llama-3.1-8b_Q4_K_M.jsonl" 2>/dev/null; tail -2 "$O/llamacpp_batched_llama-3.1-8b_Q4_K_M.jsonl"
timeout 120 python3 -m stagewise bench $f --devices cuda:0 --placement single --concurrency 1,32 --prompt 128 --gen 128 --repeats 1 --json \
  > "$O/stagewise_concurrency_llama-3.1-8b_Q4_K_M.json" 2> /tmp/conc.err || tail -5 /tmp/conc.err
stamp done
