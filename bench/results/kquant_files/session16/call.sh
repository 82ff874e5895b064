#!/usr/bin/env bash
# Session 16's kernel call (carry .wheels; ~8 min): issue 45's next lever, measured before it is built.
#  1. bench/kernel_a_mma.py: kernel A / B on Llama-3.1-8B's Q4_K shapes at 8 / 16 / 32 / 64 rows beside the same
#     values dotted the other way round (per-warp MMAs, no warpgroup wait), with each group's sum(x) from a table
#     or left out, and kernel-B-style dequantized values; then kernel A without its sum(x) dot (what that dot costs);
#  2. constant_ab.py, random Llama-3.1-8B @q4_k, decode at 2 / 8 / 32 streams: a fused gate/up's SiLU·up in kernel
#     A's epilogue (GLU_MAX_ROWS 16, landed) against the matmul then silu_mul (0); kernels A and B rows first
#     (ROWS_FIRST_MAX_ROWS 128) against today's orientation (the first run); kernel B rows first from one row with
#     its Q4_K quants by the inline PTX (A_MAX_ROWS 0, B_NIBBLE_ASM 1: the best layout of 2026-12-07's kernel times).
set -u
O=${OUT:-/tmp/out}; R=/tmp/s16; mkdir -p "$O" "$R"
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/machine.txt"
# QUICK=1 (little device time left): the kernels alone at 8 and 32 rows, no model loads
ROWS=8,16,32,64; [ "${QUICK:-0}" = 1 ] && ROWS=8,32
timeout 240 python3 bench/kernel_a_mma.py --rows $ROWS --json "$R/kernel_a_mma.json" 2>&1 | grep -v Warn | tail -16
timeout 100 python3 bench/kernel_a_mma.py --rows 8 --kernel-a-no-min --json "$R/kernel_a_no_min.json" 2>&1 | grep -v Warn | cut -c1-120 | tail -8
[ "${QUICK:-0}" = 1 ] && { tar czf "$O/results.tgz" -C "$R" .; exit 0; }
AB=bench/results/hybrid_serving_h200/session15/constant_ab.py; M=random:llama-3.1-8b@q4_k
K=stagewise.kernels
for sets in "--set stagewise.weights.quant.packed_weight.GLU_MAX_ROWS=16" "--set stagewise.weights.quant.packed_weight.GLU_MAX_ROWS=0" \
    "--set $K.packed_decode_triton.ROWS_FIRST_MAX_ROWS=128" \
    "--set $K.packed_decode_triton.ROWS_FIRST_MAX_ROWS=128 --set $K.packed_matmul.A_MAX_ROWS=0 --set $K.packed_decode_triton.B_NIBBLE_ASM=1"; do
  timeout 120 python3 $AB $M --levels 2,8,32 $sets 2>&1 | grep '"set"' | tee -a "$R/constant_ab_llama8b_q4k.jsonl"
done
# the compiled kernels in every layout (the ones landed off included), every packed type: what a flip needs
timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_packed_decode.py -k compiled 2>&1 | tail -8 | tee "$R/gpu_tests_packed_decode.txt"
tar czf "$O/results.tgz" -C "$R" .
