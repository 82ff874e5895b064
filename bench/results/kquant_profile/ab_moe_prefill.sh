#!/usr/bin/env bash
# Three MoE changes, the tree before them (3539077) against this one, in one call:
# (1) packed experts at prefill sizes through kernel B's 64-row blocks instead of the grouped GEMM's dequantized
#     tiles (3-4x slower at 32-64 rows in the dense sweep, h100/packed_decode_sweep_q4k.json; Qwen3.6's 512-token
#     prefill spent 66 of its 84 ms of kernels there, h100/profile_prefill_qwen36_q4k_512.json);
# (2) routed slots through the word GEMV up to one an expert (Qwen3.6 at 8 streams: 64 slots, kernel A's blocks
#     before);
# (3) SiLU·up in the word GEMV's epilogue for routed experts and small gate/ups (the shared expert): two launches
#     fewer a MoE layer at one stream.
# First the compiled kernels' tests, then the experts alone (bench/packed_decode.py, 8 and 512 tokens, every path), then Qwen3.6-35B-A3B Q4_K: TTFT
# of one 512- and one 2,048-token prompt, decode at 1, 8 and 32 streams. The old tree, prepared here with
#   mkdir -p .ab_prefill && git archive 3539077 stagewise bench/__init__.py | tar -x -C .ab_prefill; echo .ab_prefill >> .git/info/exclude
# Carry [".wheels", ".ab_prefill"]: bash bench/results/kquant_profile/ab_moe_prefill.sh (about 7 minutes)
set -u
source bench/ab_bench.sh  # ab_setup OLD_DIR HINT; ab_bench SIDE MODEL STREAMS PROMPT GEN NAME
ab_setup .ab_prefill "this script's header"
stamp "the compiled kernels' tests: expert blocks A and B against the grouped GEMM, SiLU·up in the word GEMV"
PYTHONPATH=$NEW:/tmp/site timeout 100 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_packed_decode.py \
  tests/test_packed_kernels.py -k "compiled_expert or silu_up" > "$O/gpu_tests_moe_paths.txt" 2>&1
tail -3 "$O/gpu_tests_moe_paths.txt"
stamp "the experts alone, Q4_K, 8 and 512 tokens"
PYTHONPATH=$NEW:/tmp/site timeout 150 python3 bench/packed_decode.py --types q4_k --rows "" --moe-tokens 8,512 \
  --out "$O/packed_experts_prefill.json" 2>&1 | grep -v Warning | tail -6
AB_BUDGET_S=560 AB_CAP_S=110
for side in new old new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1 512 16 qwen36_q4k_prefill512; done
for side in new old new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1,8,32 128 128 qwen36_q4k_decode; done
for side in new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1 2048 16 qwen36_q4k_prefill2048; done
stamp done
