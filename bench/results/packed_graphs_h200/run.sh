#!/usr/bin/env bash
# Packed steps in graph pieces (runtime/packed_graphs.py) and decode GEMVs rows fastest, on one GPU, one
# call (< 10 min). Old tree = 3d8beba (packed steps eager, GEMV columns fastest) in .ab_gemv (prepare it as
# bench/results/gemv_rows_h200/run.sh says); new = this tree. Carry [".ab_gemv", ".wheels"].
#   (1) the GPU tests of both changes (capture and replay against the eager step, staged = single);
#   (2) `stagewise bench` of Llama-3.1-8B bf16 (random weights): one 512-token prompt (TTFT = prefill,
#       was 36 ms eager against 12.5 graphed) and 8 streams of 208-token prompts, each tree;
#   (3) bench/gemv_rows.py from each tree (µs and TB/s at 1/2/4/8/16 rows);
#   (4) Qwen3.6-35B-A3B Q8_0 (make-model file, reused if present): 1 stream of 2,048 tokens (was 444 ms
#       eager, 264 graphed) and 8 streams of 128-token prompts (decode 715 tok/s before), each tree.
set -u
source bench/ab_bench.sh  # ab_setup OLD_DIR HINT; ab_bench SIDE MODEL STREAMS PROMPT GEN NAME
ab_setup .ab_gemv bench/results/gemv_rows_h200/run.sh
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf
stamp "(1) GPU tests"
PYTHONPATH=$NEW:/tmp/site timeout 150 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/test_packed_graphs.py \
  tests/test_triton_kernels.py -k "gemv or pieces" 2>&1 | tail -15 | tee "$O/gpu_tests.txt"
stamp "(1b) the load check's peak with the graphs' pools counted (peak within the charge, tiny models)"
PYTHONPATH=$NEW:/tmp/site timeout 200 python3 -m pytest -q -m gpu -rfE -p no:cacheprovider tests/test_peak_check.py 2>&1 \
  | tail -15 | tee -a "$O/gpu_tests.txt"
AB_BUDGET_S=560 AB_CAP_S=120
for side in new old; do ab_bench $side random:llama-3.1-8b 1 512 16 llama8b_p512; done
for side in new old; do ab_bench $side random:llama-3.1-8b 8 208 64 llama8b_8x208; done
for side in old new; do
  T=$NEW; [ $side = old ] && T=$OLD
  stamp "(3) gemv rows, $side"
  (cd $T && PYTHONPATH=$T:/tmp/site timeout 80 python3 bench/gemv_rows.py --out "$O/gemv_rows_$side.json" 2>&1 | grep -v Warning)
done
stamp "(4) make-model (if absent)"
[ -f $F ] || PYTHONPATH=$NEW:/tmp/site timeout 220 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
[ -f $F ] && for side in new old; do ab_bench $side $F 1 2048 16 qwen36_p2048; done
[ -f $F ] && for side in new old; do ab_bench $side $F 8 128 64 qwen36_8x128; done
stamp done
