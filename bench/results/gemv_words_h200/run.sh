#!/usr/bin/env bash
# One GPU call (< 10 min), issues 44 and 45 together. Old tree = 3d8beba in .ab_gemv (packed steps eager, the slot
# GEMV; prepare it as bench/results/gemv_rows_h200/run.sh says); new = this tree. Carry [".wheels", ".ab_gemv"].
#  (1) GPU tests: the packed GEMVs with the word GEMV compiled (its inline PTX), kernels A / B and the dispatch;
#      packed steps' graph pieces (capture and replay against the eager step, staged = single), the load check's
#      peak with the graphs' pools;
#  (2) bench/packed_gemv.py --types q4_k,q6_k --words: the word GEMV against the slot / byte GEMV at Llama-3.1-8B shapes,
#      in graphs; bench/packed_decode.py: kernel A against the GEMV at 1 row (Q6_K took kernel A: 99 us gate/up);
#  (3) `stagewise bench random:llama-3.1-8b@q4_k` (every matrix Q4_K, the head Q6_K; random weights take no
#      Q4_K_M mix: a make-model file does), one stream, old and new (2026-12-06 on an H100: 196.9 -> 316.3);
#      The same for Qwen3.6-35B-A3B (routed experts and the 248k-row Q6_K head through the word GEMV; 308 tok/s
#      before on the H200, llama.cpp 229 on the Q4_K_M file, target >= 366);
#  (4) Llama-3.1-8B bf16: one 512-token prompt and 8 streams of 208-token prompts, old and new (graph pieces).
set -u
source bench/ab_bench.sh  # ab_setup OLD_DIR HINT; ab_bench SIDE MODEL STREAMS PROMPT GEN NAME
ab_setup .ab_gemv bench/results/gemv_rows_h200/run.sh
stamp "(1) GPU tests"
PYTHONPATH=$NEW:/tmp/site timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_packed_kernels.py \
  -k "word" 2>&1 | tail -8 | tee "$O/gpu_tests.txt"  # compiled: each test's configs take 5-10 s on the H100 host
PYTHONPATH=$NEW:/tmp/site timeout 240 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/test_packed_graphs.py \
  tests/test_peak_check.py 2>&1 | tail -12 | tee -a "$O/gpu_tests.txt"
stamp "(2) packed GEMV, Q4_K and Q6_K; kernel A against the GEMV"
PYTHONPATH=$NEW:/tmp/site timeout 200 python3 bench/packed_gemv.py --types q4_k,q6_k --words --out "$O/packed_gemv_words.json" \
  2>&1 | grep -v Warning  # the word tiles and PTX off against the former path's config (--words: few compiles)
PYTHONPATH=$NEW:/tmp/site timeout 80 python3 bench/packed_decode.py --types q4_k,q6_k --shapes gate/up,down \
  --rows 1 --moe-tokens "" --out "$O/packed_decode_words.json" 2>&1 | grep -v Warning | tail -8
AB_BUDGET_S=570 AB_CAP_S=110
for side in new old; do ab_bench $side random:llama-3.1-8b@q4_k 1 128 128 llama8b_q4k_1; done
for side in new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1 128 128 qwen36_q4k_1; done
for side in new old; do ab_bench $side random:llama-3.1-8b 1 512 16 llama8b_p512; done
for side in new old; do ab_bench $side random:llama-3.1-8b 8 208 64 llama8b_8x208; done
stamp done
