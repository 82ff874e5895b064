#!/usr/bin/env bash
# The shared expert folded into the router's matmul and the combine (two launches fewer a MoE block): Qwen3.6-35B-A3B
# decode at 1 and 8 streams, old tree against this one, same call. Old = c68056d (before the fold), prepared here with
#   mkdir -p .ab_moe && git archive c68056d stagewise bench/__init__.py | tar -x -C .ab_moe; echo .ab_moe >> .git/info/exclude
# Carry [".wheels", ".ab_moe"]: bash bench/results/kquant_profile/ab_moe.sh (about 6 minutes)
set -u
source bench/ab_bench.sh  # ab_setup OLD_DIR HINT; ab_bench SIDE MODEL STREAMS PROMPT GEN NAME
ab_setup .ab_moe "this script's header"
AB_BUDGET_S=560 AB_CAP_S=130
for side in new old new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1,8 128 128 qwen36_q4k_moe_fold; done
stamp done
