#!/usr/bin/env bash
# Session 20's device calls (carry [".wheels"]; run again on the same warm machine until it says "all done"; none
# starts past DEADLINE_S, default 560). Decode A/Bs (constant_ab.py, one setting a process) on random weights in
# llama.cpp's Q4_K_M mix (random:PRESET@q4_k_m: Q6_K beside Q4_K, as the issue's files): first Llama-3.1-8B at 2 / 8 /
# 16 / 32 streams with its narrow Q4_K matrices (o, down) in their own tiles (packed_matmul.NARROW_MAX_N 4096, the
# default) against without (0) (its Q6_K matrices, attn_v, half of ffn_down and the head, stay in kernel A: kernel B
# took 27-90 % longer at 8 rows on qkv and o in session 19's sweep); then the compiled kernels' GPU tests (four
# processes, and the word GEMV's: Q6_K's PTX changed, Q2_K's and Q3_K's PTX and Q3_K's word GEMV are new in this session); then
# Qwen3.6-35B-A3B at 2 / 8 / 32 with its decode expert blocks in kernel A (the default) or B (EXPERT_B_FROM_ONE_ROW
# 1), and Llama Q5_K (Q5_K_M files' type) in kernel A up to 16 rows (today) or B from one row; then packed_decode.py
# --sweep: kernel A's tiles (and kernel B's default tiles) for Q6_K and Q5_K at 8 rows, kernel B's for Q4_K and Q6_K
# at 32 and 64 rows (session 19 swept Q4_K at 2-16 rows). Results: $OUT/kquant_s20.tgz.
set -u
O=${OUT:-/tmp/out}; W=/tmp/s20; mkdir -p "$O" "$W/done"; t0=$(date +%s); DEADLINE_S=${DEADLINE_S:-560}
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$W/machine.txt"
left() { [ $(( $(date +%s) - t0 + $1 )) -le "$DEADLINE_S" ]; }
AB=bench/results/hybrid_serving_h200/session15/constant_ab.py; n=0
ab_jobs() {  # MODEL|LEVELS|SETTINGS lines on stdin; n counts jobs across calls of this function (done markers)
  while IFS='|' read -r m levels sets; do
    n=$((n + 1)); [ -e "$W/done/ab$n" ] && continue
    limit=125; [ -e "$W/done/compiled_$m" ] || limit=280  # a model's first process compiles its kernels
    left $((limit + 5)) || { echo "left for the next call: $m $sets"; continue; }
    timeout $limit python3 $AB random:$m --levels $levels $sets < /dev/null > "$W/ab.out" 2>&1
    grep '"set"' "$W/ab.out" | sed "s/^/$m /" | tee -a "$W/constant_ab.jsonl" | grep -q . \
      && touch "$W/done/ab$n" "$W/done/compiled_$m" || { echo "failed: $m $sets"; grep -v Warn "$W/ab.out" | tail -3; }
  done
}
ab_jobs <<JOBS
llama-3.1-8b@q4_k_m|2,8,16,32|
llama-3.1-8b@q4_k_m|2,8,16,32|--set stagewise.kernels.packed_matmul.NARROW_MAX_N=0
JOBS
if [ ! -e "$W/done/tests" ] && left 100; then  # four processes at once (the compiles are most of their time); Q6_K's, Q3_K's PTX
  # changed in this session: checked here before the other A/Bs
  i=0
  for sel in "bf16 and (Q4_0 or Q4_1 or Q5_0 or Q5_1)" "bf16 and (Q2_K or Q3_K or Q4_K or Q5_K)" \
             "bf16 and (Q6_K or IQ4_NL or IQ4_XS or MXFP4)" "not bf16 or blocks"; do
    i=$((i + 1))
    timeout 95 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_packed_decode.py -k "compiled and ($sel)" \
      > "$W/gpu_tests_packed_decode_$i.txt" 2>&1 &
  done
  timeout 95 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_packed_kernels.py -k word \
    > "$W/gpu_tests_word_gemv.txt" 2>&1 &  # the word GEMV compiled (on a GPU), Q3_K's new with the others
  wait; tail -n 3 "$W"/gpu_tests_packed_decode_*.txt "$W/gpu_tests_word_gemv.txt"
  touch "$W/done/tests"
fi
ab_jobs <<JOBS
qwen3.6-35b-a3b@q4_k_m|2,8,32|
qwen3.6-35b-a3b@q4_k_m|2,8,32|--set stagewise.kernels.packed_matmul.EXPERT_B_FROM_ONE_ROW=1
llama-3.1-8b@q5_k|2,8,16|
llama-3.1-8b@q5_k|2,8,16|--set stagewise.kernels.packed_matmul.B_FROM_ONE_ROW=types:Q4_K,Q5_K
JOBS
if [ ! -e "$W/done/sweep" ] && left 150; then  # kernel A's tiles (and B's default) for Q6_K and Q5_K at 8 rows
  timeout $(( DEADLINE_S - ($(date +%s) - t0) - 5 )) python3 bench/packed_decode.py --types q6_k,q5_k --rows 8 \
    --moe-tokens "" --sweep --out "$W/packed_decode_sweep_q6k_q5k.json" 2>&1 | grep -v Warn > "$W/packed_decode_sweep_q6k_q5k.txt"
  cut -c1-300 "$W/packed_decode_sweep_q6k_q5k.txt"; touch "$W/done/sweep"
fi
if [ ! -e "$W/done/sweep_b" ] && left 200; then  # kernel B's tiles past 16 rows (two-warp tiles among them): Q4_K, Q6_K
  timeout $(( DEADLINE_S - ($(date +%s) - t0) - 5 )) python3 bench/packed_decode.py --types q4_k,q6_k --rows 32,64 \
    --moe-tokens "" --sweep --out "$W/packed_decode_sweep_b_32_64.json" 2>&1 | grep -v Warn > "$W/packed_decode_sweep_b_32_64.txt"
  cut -c1-300 "$W/packed_decode_sweep_b_32_64.txt"; touch "$W/done/sweep_b"
fi
[ "$(ls "$W/done" | grep -c '^ab')" -eq "$n" ] && [ -e "$W/done/tests" ] && echo "all done"
tar czf "$O/kquant_s20.tgz" -C "$W" --exclude done .
