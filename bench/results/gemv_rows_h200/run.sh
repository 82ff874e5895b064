#!/usr/bin/env bash
# Decode GEMVs, rows fastest (one H200, one call < 10 min). Before: the GEMV grid ran (column tile, row)
# with column tiles fastest, so at 2-16 rows each row swept the whole matrix before the next began and a
# matrix past L2 (Qwen3.6's 248k-row Q8_0 head, its fused input projections) was read from memory once per
# row: a hypothesis for Qwen3.6 Q8_0 decoding 715 tok/s at 8 streams (11.2 ms a step, as long as 32
# streams' 11.5 ms). After: one program per (row, tile), rows fastest (kernels/gemv_triton.py gemv_tile).
# (1) bench/gemv_rows.py from each tree: µs and TB/s at 1/2/4/8/16 rows; (2) `stagewise bench` decode
# tok/s of Qwen3.6-35B-A3B Q8_0 (make-model file) at 1/4/8/16 streams and Llama-3.1-8B bf16 (random) at
# 1/2/4, each tree. Prepare the old tree here first (no device time), in the repo root:
#   grep -qx '/.ab_gemv/' .git/info/exclude || echo /.ab_gemv/ >> .git/info/exclude
#   rm -rf .ab_gemv && mkdir .ab_gemv && git archive 3d8beba stagewise bench/__init__.py bench/kernel_timing.py | tar -x -C .ab_gemv && cp bench/gemv_rows.py .ab_gemv/bench/
# then carry [".ab_gemv", ".wheels"]: bash bench/results/gemv_rows_h200/run.sh
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d .ab_gemv/stagewise ] || { echo "no .ab_gemv: prepare it first (see the header)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONUNBUFFERED=1
NEW=$PWD OLD=$PWD/.ab_gemv W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for side in old new; do
  T=$NEW; [ $side = old ] && T=$OLD
  stamp "(1) gemv rows, $side"
  (cd $T && PYTHONPATH=$T:/tmp/site timeout 100 python3 bench/gemv_rows.py --out "$O/gemv_rows_$side.json" 2>&1 | grep -v Warning)
done
stamp "make-model (if absent)"
[ -f $F ] || PYTHONPATH=$NEW:/tmp/site timeout 220 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
ls -l $F
bench() {  # side model concurrency name
  T=$NEW; [ $1 = old ] && T=$OLD
  left=$(( 570 - ($(date +%s) - t0) )); [ $left -lt 40 ] && { stamp "no time for $4 $1"; return; }
  stamp "(2) $4, $1 (${left} s left)"
  (cd $T && PYTHONPATH=$T:/tmp/site timeout $(( left < 150 ? left : 150 )) python3 -m stagewise bench "$2" --devices cuda:0 \
    --placement single --concurrency $3 --prompt 128 --gen 128 --repeats 1 --json > "$O/bench_$4_$1.json" 2> "$O/bench_$4_$1.err")
  python3 - "$O/bench_$4_$1.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no result:", e); sys.exit()
print("  " + " | ".join(f"{l['streams']}: {l['decode_tokens_per_s']:.0f}" for l in d["levels"]))
PY
  tail -2 "$O/bench_$4_$1.err" | grep -v Warning
}
[ -f $F ] && for side in new old; do bench $side $F 1,4,8,16 qwen36_q8; done
for side in new old; do bench $side random:llama-3.1-8b 1,2,4 llama8b_bf16; done
stamp done
