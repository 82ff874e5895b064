#!/usr/bin/env bash
# Session 18's kernel A / kernel B A/B (carry .wheels; run again on the same warm machine until it says "all done"):
# the compiled kernels' GPU tests (every packed type), kernel A's tiles timed alone (bench/packed_decode.py --sweep:
# wgmma against mma.sync at 8 and 16 rows, kernel B at those rows, its two arithmetics), then decode of random
# Llama-3.1-8B per type and setting (bench/results/hybrid_serving_h200/session15/constant_ab.py, one setting a
# process): kernel B's values by bf16 arithmetic (packed_decode_triton.B_BF16_FMA, on since the sweep of session 18)
# against float32 (B_BF16_FMA 0), end to end: Q4_K at 2 / 8 / 32 streams (kernel B from one row), Q6_K and
# IQ4_XS at 32 / 64. (The sweep and the tests ran in session 18: AB_ONLY=1 goes straight to the decode A/B.)
# Jobs already done on this machine are skipped; none starts past DEADLINE_S (560).
set -u
O=${OUT:-/tmp/out}; W=/tmp/s18; mkdir -p "$O" "$W/done"; t0=$(date +%s); DEADLINE_S=${DEADLINE_S:-560}
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$W/machine.txt"
left() { [ $(( $(date +%s) - t0 + $1 )) -le "$DEADLINE_S" ]; }
tests() {
if [ ! -e "$W/done/tests" ] && left 250; then  # four processes at once: the compiles are most of their time
  i=0
  for sel in "1-False" "8-False" "40-False" "not (1-False or 8-False or 40-False)"; do
    i=$((i + 1))
    timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_packed_decode.py -k "compiled and ($sel)" \
      > "$W/gpu_tests_packed_decode_$i.txt" 2>&1 &
  done
  wait; tail -n 3 "$W"/gpu_tests_packed_decode_*.txt
  touch "$W/done/tests"
fi
}
sweep() {
if [ ! -e "$W/done/sweep" ] && left 120; then  # kernel A's tiles at Llama-3.1-8B's gate/up and down, mma.sync included
  timeout $(( DEADLINE_S - ($(date +%s) - t0) - 10 < 320 ? DEADLINE_S - ($(date +%s) - t0) - 10 : 320 )) python3 bench/packed_decode.py --types q6_k,q4_k,iq4_xs,q5_k --shapes gate/up,down --rows 8,16 --moe-tokens "" \
    --sweep --out "$W/packed_decode_sweep.json" 2>&1 | grep -v Warn | tee "$W/packed_decode_sweep.txt" | cut -c1-400
  touch "$W/done/sweep"
fi
}
# SWEEP_FIRST=1 (a call with little device time left): the timings first, then the tests; AB_ONLY=1: neither (both ran
# in session 18: the sweep's results and the tests' are in this folder)
[ "${AB_ONLY:-0}" = 1 ] && touch "$W/done/tests" "$W/done/sweep"
if [ "${SWEEP_FIRST:-0}" = 1 ]; then sweep; tests; else tests; sweep; fi
AB=bench/results/hybrid_serving_h200/session15/constant_ab.py; K=stagewise.kernels; n=0
F32="--set $K.packed_decode_triton.B_BF16_FMA=0"
while IFS='|' read -r m levels sets; do
  n=$((n + 1)); [ -e "$W/done/ab$n" ] && continue
  # a type's first process compiles its kernels (cold: more than 100 s on 2026-12-07's H100)
  limit=125; [ -e "$W/done/compiled_$m" ] || limit=280
  left $((limit + 5)) || { echo "left for the next call: $m $sets"; continue; }
  timeout $limit python3 $AB random:llama-3.1-8b@$m --levels $levels $sets < /dev/null > "$W/ab.out" 2>&1
  grep '"set"' "$W/ab.out" | sed "s/^/$m /" | tee -a "$W/constant_ab.jsonl" | grep -q . \
    && touch "$W/done/ab$n" "$W/done/compiled_$m" || { echo "failed: $m $sets"; grep -v Warn "$W/ab.out" | tail -3; }
done <<JOBS
q4_k|2,8,32|
q4_k|2,8,32|$F32
q6_k|32,64|
q6_k|32,64|$F32
iq4_xs|32,64|
iq4_xs|32,64|$F32
JOBS
[ "$(ls "$W/done" | grep -c '^ab')" -eq "$n" ] && echo "all done"
tar czf "$O/kquant_s18.tgz" -C "$W" --exclude done .
