#!/usr/bin/env bash
# Packed GGUF types on one H200 (issue #29), in one call: kernel tests on the GPU, decode/prefill of
# random packed weights beside Q8_0 and bf16, and (when LLAMA_SRC is given) llama.cpp built alongside
# for the same-file comparisons of bench/packed_llamacpp.sh.
# Usage (repository root): bash bench/packed_suite.sh OUTDIR
set -u
OUT=${1:?output directory}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B="python3 -m stagewise bench"
stamp kernel tests on the GPU
timeout 240 python3 -m pytest tests/test_packed_kernels.py tests/test_triton_kernels.py -q -x -p no:cacheprovider 2>&1 | tail -4
for m in ${MODELS:-llama-3.1-8b@q4_k llama-3.1-8b@q6_k llama-3.1-8b@iq4_xs llama-3.1-8b@q8_0 llama-3.1-8b qwen3-30b-a3b@q4_k}; do
  stamp "bench $m"
  timeout 150 $B "random:$m" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
    > "$OUT/bench_${m//[@.-]/_}.json" 2> "$OUT/bench_${m//[@.-]/_}.err" || tail -5 "$OUT/bench_${m//[@.-]/_}.err"
done
stamp done
for f in "$OUT"/bench_*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['stagewise']; print(sys.argv[1].split('/')[-1], {k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$f" 2>/dev/null || echo "$f: no result"
done
