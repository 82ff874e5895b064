#!/usr/bin/env bash
# The shared expert folded into the router's matmul and the combine (two launches fewer a MoE block): Qwen3.6-35B-A3B
# decode at 1 and 8 streams, old tree against this one, same call. Old = c68056d (before the fold), prepared here with
#   mkdir -p .ab_moe && git archive c68056d stagewise bench/__init__.py | tar -x -C .ab_moe; echo .ab_moe >> .git/info/exclude
# Carry [".wheels", ".ab_moe"]: bash bench/results/kquant_profile/ab_moe.sh (about 6 minutes)
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d .ab_moe/stagewise ] || { echo "no .ab_moe: prepare it first (this script's header)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONUNBUFFERED=1
NEW=$PWD OLD=$PWD/.ab_moe
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
AB_BUDGET_S=560 AB_CAP_S=130
source bench/ab_bench.sh  # ab_bench SIDE MODEL STREAMS PROMPT GEN NAME
for side in new old new old; do ab_bench $side random:qwen3.6-35b-a3b@q4_k 1,8 128 128 qwen36_q4k_moe_fold; done
stamp done
