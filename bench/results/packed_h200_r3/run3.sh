#!/usr/bin/env bash
# Round 3, call 3 (one H200): (a) the status page polled beside unpolled runs, 64 streams, 768 tokens
# out, 4 A B B A rounds, on cores 0-5 (#34) while llama.cpp builds on cores 6-15; (b) llama.cpp beside
# stagewise on the same Llama-3.1-8B Q4_K_M file (llama-quantize of a random-weight F16 make-model file):
# llama-bench pp512/tg128 and stagewise bench; assess's prediction beside the measured charge (#29).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
( cmake -S .llamacpp -B build/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /tmp/cmake.log 2>&1 \
  && taskset -c 6-15 cmake --build build/lb -j 10 --target llama-bench llama-quantize > /tmp/build.log 2>&1; echo "[build rc $?]" ) &
stamp "serve_load status A/B (cores 0-5)"
taskset -c 0-5 timeout 240 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 64 \
  --concurrency 64 --prompt 208 --gen 768 --status-poll-s 1 --status-rounds 4 --no-in-process \
  --json "$O/serve_status_ab3_llama8b_h200.json" 2>&1 | grep -E "status every|^burst 64 " | head -16
W=/tmp/w; mkdir -p $W
stamp "f16 file"
timeout 120 python3 -m stagewise make-model --config llama-3.1-8b --dtype f16 --seed 0 --device cuda "$W/llama-3.1-8b-f16.gguf" > /dev/null
stamp "f16 file written"; wait; stamp "built"; tail -2 /tmp/build.log
B=build/lb/bin
f=$W/llama-3.1-8b-Q4_K_M.gguf
timeout 120 $B/llama-quantize $W/llama-3.1-8b-f16.gguf $f Q4_K_M 16 > /tmp/q.log 2>&1 || tail -3 /tmp/q.log
rm -f $W/llama-3.1-8b-f16.gguf; ls -l $f; stamp quantized
timeout 60 python3 -m stagewise assess $f --devices cuda:0 --json > "$O/assess_llama-3.1-8b_Q4_K_M.json" 2>&1
timeout 80 $B/llama-bench -m $f -p 512 -n 128 -r 2 -ngl 99 -fa 1 -o json > "$O/llamabench_llama-3.1-8b_Q4_K_M.json" 2>/dev/null
python3 -c "import json,sys; [print('llama.cpp', r['n_prompt'], r['n_gen'], round(r['avg_ts'],1)) for r in json.load(open(sys.argv[1]))]" "$O/llamabench_llama-3.1-8b_Q4_K_M.json"
stamp "llama-bench done"
timeout 110 python3 -m stagewise bench $f --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
  > "$O/stagewise_llama-3.1-8b_Q4_K_M.json" 2> /tmp/bench.err || tail -5 /tmp/bench.err
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/stagewise_llama-3.1-8b_Q4_K_M.json"
stamp done
