#!/usr/bin/env bash
# Session 17's kernel A/B (carry .wheels): decode of random Llama-3.1-8B @q4_k at 2 / 8 / 32 streams
# (bench/results/hybrid_serving_h200/session15/constant_ab.py, one setting a process), settings in order while
# DEADLINE_S (default 560) allows: today's defaults; kernel A in blocks of 8 rows (packed_matmul.A_MIN_BLOCK_M 8:
# half the accumulator to scale at 2-8 rows); SiLU·up outside the GEMM (GLU_MAX_ROWS 0, against the landed 16);
# kernels A and B rows first, kernel B from one row with the PTX quants (session 16's standalone winner's layout).
# GPU_TESTS=1 first runs the compiled kernels' GPU tests (every packed type, every layout).
set -u
O=${OUT:-/tmp/out}; R=/tmp/s17; mkdir -p "$O" "$R"; t0=$(date +%s); DEADLINE_S=${DEADLINE_S:-560}
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/machine.txt"
if [ "${GPU_TESTS:-0}" = 1 ]; then
  timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_packed_decode.py -k compiled 2>&1 | tail -8 | tee "$R/gpu_tests_packed_decode.txt"
fi
AB=bench/results/hybrid_serving_h200/session15/constant_ab.py; M=random:llama-3.1-8b@q4_k; K=stagewise.kernels
for sets in "" "--set $K.packed_matmul.A_MIN_BLOCK_M=8" "--set stagewise.weights.quant.packed_weight.GLU_MAX_ROWS=0" \
    "--set $K.packed_decode_triton.ROWS_FIRST_MAX_ROWS=128 --set $K.packed_matmul.A_MAX_ROWS=0 --set $K.packed_decode_triton.B_NIBBLE_ASM=1"; do
  [ $(( $(date +%s) - t0 + 130 )) -gt "$DEADLINE_S" ] && { echo "left: $sets"; continue; }
  timeout 125 python3 $AB $M --levels 2,8,32 $sets 2>&1 | grep '"set"' | tee -a "$R/constant_ab_llama8b_q4k.jsonl"
done
tar czf "$O/kquant_s17.tgz" -C "$R" .
