#!/usr/bin/env bash
# 2026-12-06, one H100, one call (< 10 min): call7.sh's `stagewise serve` of the make-model Qwen3.6-35B-A3B Q8_0
# file stopped in warm-up with "the model produced non-finite logits". Which change: the same serve (--max-seqs
# 64 --context 4096) until "warmed up" or an error, with this tree, with STAGEWISE_PDL=0, with the tree before
# the shared expert's fold (c68056d, prepared as in kquant_profile/ab_moe.sh's header), and with random weights
# made on the device (random:qwen3.6-35b-a3b@q8_0) instead of the file. Carry [".wheels", ".ab_moe"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
stamp "make-model (if absent)"
[ -f $F ] || PYTHONPATH=$PWD:/tmp/site timeout 220 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 \
  --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
ls -l $F || exit 1
warm() {  # warm NAME TREE MODEL [ENV...]: serve until warmed up or an error, at most 130 s
  local name=$1 tree=$2 model=$3; shift 3
  stamp "$name"
  env "$@" PYTHONPATH=$tree:/tmp/site python3 -m stagewise serve $model --devices cuda:0 --placement single \
    --max-seqs 64 --context 4096 --port $((18000 + RANDOM % 1000)) > "$O/warm_$name.txt" 2>&1 &
  local pid=$! i
  for i in $(seq 130); do
    sleep 1; grep -q -E "warmed up|error" "$O/warm_$name.txt" && break; kill -0 $pid 2>/dev/null || break
  done
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  grep -E "warmed up|error|Error" "$O/warm_$name.txt" | head -3
}
warm new $PWD $F
warm new_pdl0 $PWD $F STAGEWISE_PDL=0
warm old_c68056d $PWD/.ab_moe $F
warm new_random $PWD random:qwen3.6-35b-a3b@q8_0
warm new_again $PWD $F
stamp done
