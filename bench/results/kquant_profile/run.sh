#!/usr/bin/env bash
# Issue 45, one call (< 10 min, each step capped): where a packed decode step's time goes at the stream counts
# behind llama.cpp's ratio targets (../kquant_files/README.md: Llama-3.1-8B Q4_K_M 1.07-1.16x at 8-32 streams, Q6_K
# 0.91x at 32, Qwen3.6 1.09x at 8), and kernels A and B's tiles timed at those row counts.
#  (1) bench/profile_batch.py: a decode step's wall time beside its kernels' device time, kernels ranked, for
#      random:llama-3.1-8b@q4_k and @q6_k at 32 streams, random:qwen3.6-35b-a3b@q4_k at 8; bench/profile_prefill.py:
#      a 512-token prompt of the Qwen3.6 (pp512 at 0.66x llama.cpp's);
#  (2) bench/packed_decode.py --sweep: kernel A (8 rows) and B (32, 64 rows) tiles for Q4_K, then Q6_K, at
#      Llama-3.1-8B's four shapes, inside CUDA graphs, each beside packed_matmul's own tiles and dense bf16.
# From the repository root with .wheels/ carried: bash bench/results/kquant_profile/run.sh
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
profile() {  # profile MODEL STREAMS NAME CAP_S
  stamp "profile $1 at $2 streams"
  timeout "$4" python3 bench/profile_batch.py "$1" --streams "$2" --steps 8 --json "$O/profile_$3.json" 2>&1 \
    | grep -v Warning | tail -20
}
profile random:llama-3.1-8b@q4_k 32 llama8b_q4k_32 110
profile random:llama-3.1-8b@q6_k 32 llama8b_q6k_32 80
profile random:qwen3.6-35b-a3b@q4_k 8 qwen36_q4k_8 110
stamp "profile a 512-token prefill of random:qwen3.6-35b-a3b@q4_k (0.66x llama.cpp's pp512 on the Q4_K_M file)"
timeout 100 python3 bench/profile_prefill.py random:qwen3.6-35b-a3b@q4_k --prompt 512 \
  --out "$O/profile_prefill_qwen36_q4k_512.json" 2>&1 | grep -v Warning | tail -16
stamp "kernel tiles, Q4_K"
timeout 100 python3 bench/packed_decode.py --types q4_k --rows 8,32,64 --moe-tokens "" --sweep \
  --out "$O/packed_decode_sweep_q4k.json" 2>&1 | grep -v Warning
stamp "kernel tiles, Q6_K"
timeout 70 python3 bench/packed_decode.py --types q6_k --shapes gate/up,down --rows 32 --moe-tokens "" --sweep \
  --out "$O/packed_decode_sweep_q6k.json" 2>&1 | grep -v Warning
stamp done
