#!/usr/bin/env bash
# Sourced by a device call's run.sh: `ab_bench SIDE MODEL STREAMS PROMPT GEN NAME` runs `stagewise bench` from the
# tree of SIDE (new: $NEW, old: $OLD) on cuda:0, writes $O/bench_NAME_SIDE.json (.err beside it) and prints each
# level's decode tok/s, TTFT median and aggregate. The call's clock starts at $t0 and stops at AB_BUDGET_S seconds
# (default 560); one run takes at most AB_CAP_S seconds (default 120), and none starts with under 40 s left.
# `ab_setup OLD_DIR HINT` begins such a call: $O (the returned files), the clock $t0 and `stamp` (a timestamped
# echo), the old tree OLD_DIR checked (HINT: how to prepare it), the carried wheels installed into /tmp/site,
# NEW (this tree) and OLD, the GPU named.
ab_setup() {
  O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s)
  [ -d "$1/stagewise" ] || { echo "no $1: prepare it first ($2)"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl \
    2>&1 | tail -1
  export PYTHONUNBUFFERED=1
  NEW=$PWD OLD=$PWD/$1
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
}
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
ab_bench() {
  local tree=$NEW; [ "$1" = old ] && tree=$OLD
  local left=$(( ${AB_BUDGET_S:-560} - ($(date +%s) - t0) ))
  [ $left -lt 40 ] && { stamp "no time for $6 $1"; return; }
  local cap=${AB_CAP_S:-120}; [ $left -lt $cap ] && cap=$left
  stamp "$6, $1 (${left} s left)"
  (cd "$tree" && PYTHONPATH=$tree:/tmp/site timeout $cap python3 -m stagewise bench "$2" --devices cuda:0 \
    --placement single --concurrency $3 --prompt $4 --gen $5 --repeats 2 --json > "$O/bench_$6_$1.json" 2> "$O/bench_$6_$1.err")
  python3 - "$O/bench_$6_$1.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no result:", e); sys.exit()
for l in d["levels"]:
    print(f"  {l['streams']} streams: decode {l['decode_tokens_per_s']:.1f} tok/s, TTFT median {l['ttft_s_median'] * 1e3:.1f} ms, "
          f"aggregate {l['aggregate_tokens_per_s']:.0f}")
PY
  grep -v Warning "$O/bench_$6_$1.err" | tail -2
}
