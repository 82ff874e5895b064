#!/usr/bin/env bash
# Issue 46's planner targets (CPU, no torch): assess of the reference geometries, text and JSON, plus
# today's (main) figures beside them where main is checked out at $BEFORE (optional).
#   bench/results/fit_context/run_cpu.sh [OUT_DIR]
set -u
O=${1:-bench/results/fit_context}; mkdir -p "$O"
R=${REFERENCE:-../shared/reference}
Q="$R/models/qwen3.6-35b-a3b.json"
S="$R/topologies/seed-2x3090-pcie.json"
run() {  # name, then assess arguments
  local name=$1; shift
  echo "\$ stagewise assess $*" > "$O/$name.txt"
  COLUMNS=120 python -m stagewise assess "$@" >> "$O/$name.txt" 2>&1
  python -m stagewise assess "$@" --json > "$O/$name.json" 2>&1
}
run qwen36_q4_k_m_22.76GB_ctx32768 "$Q" --format q4_k_m --devices 22.76GB --context 32768
run qwen36_q4_k_m_22.76GB_ctx8192 "$Q" --format q4_k_m --devices 22.76GB --context 8192
run qwen36_q4_k_m_22.76GB_ctx8192_no_prefix_cache "$Q" --format q4_k_m --devices 22.76GB --context 8192 --no-prefix-cache
run qwen36_q4_k_m_22.76GB_fp8_ctx65536 "$Q" --format q4_k_m --devices 22.76GB --context 65536 --kv-dtype fp8
run qwen36_q8_0_seed_2x3090_ctx131072 "$Q" --format q8_0 --devices "$S" --context 131072
run qwen36_q8_0_seed_2x3090_ctx65536 "$Q" --format q8_0 --devices "$S" --context 65536
run llama70b_bf16_24+12GiB "$R/models/llama-3.1-70b.json" --devices 24GiB,12GiB
run llama70b_q4_k_m_24+12GiB "$R/models/llama-3.1-70b.json" --format q4_k_m --devices 24GiB,12GiB
tail -n +1 "$O"/*.txt
