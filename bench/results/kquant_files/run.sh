#!/usr/bin/env bash
# Issue 45 (and 46's GPU tests): llama.cpp beside stagewise on the same K-quant files, on one warm GPU machine,
# over several calls of this script. Each call runs the next steps not yet done (markers in $W/done), none that
# would end past DEADLINE_S seconds into the call, and returns every result so far as $OUT/results.tgz.
# Carry [".wheels", ".llamacpp"]; .llamacpp is `../shared/tools/llamacpp-source.sh .llamacpp` (llama.cpp's source).
# Steps, in order:
#   files     llama.cpp built (CUDA, sm_90a) while make-model writes Llama-3.1-8B F16 and the Qwen3.6-35B-A3B
#             Q4_K_M mix (random weights, seed 0, on the GPU); llama-quantize makes Llama's Q4_K_M, Q6_K, IQ4_XS and
#             Q5_K_M from the F16 (the files), then the F16 goes (disk);
#   FILE      for each file: llama-bench -p 512 -n 128 (prefill pp512, single-stream tg128), llama-batched-bench
#             -npp 128 -ntg 128 at the file's stream counts (S_TG), then `stagewise bench FILE` at the same counts
#             (--prompt 128 --gen 128) and once at --prompt 512 --gen 128 (prefill and one stream, with the
#             roofline: file bytes read a token / copy bandwidth measured in the run);
#   tests     the GPU-marked tests of the load check's peak and fp8 KV (issue 46), the word GEMV's compiled tests.
# Usage (repository root, GPU machine): DEADLINE_S=560 bash bench/results/kquant_files/run.sh
# (KQ_QUANTS="Q4_K_M Q6_K": only these Llama files; KQ_QWEN=0: no Qwen3.6 file: for a call with few device-minutes)
set -u
source bench/device_steps.sh  # steps_setup WORK_DIR; step NAME SECONDS; stamp; el; llamacpp_build; make_model
steps_setup "${KQ_WORK:-/tmp/kq}"
LB=/tmp/lb/bin; S="python3 -m stagewise"; QUANTS=${KQ_QUANTS:-Q4_K_M Q6_K IQ4_XS Q5_K_M}; QWEN=${KQ_QWEN:-1}
finish() {
  python3 bench/results/kquant_files/summary.py "$R" | tee "$R/summary.md"
  tar czf "$O/results.tgz" -C "$W" results; stamp "call done"; exit 0
}

if step files 0; then  # resumable: what a call cut short is redone, what is complete is kept
  { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; df -h "$W"; nproc; } | tee "$R/machine.txt"
  build=; m1=; m2=
  if [ ! -x "$LB/llama-quantize" ]; then
    llamacpp_build 14 llama-server llama-bench llama-batched-bench llama-quantize > "$W/build.log" 2>&1 &
    build=$!
  fi
  F16=$W/llama-3.1-8b-F16.gguf
  [ -f "$W/llama-3.1-8b-${QUANTS##* }.gguf" ] || { make_model llama-3.1-8b f16 "$F16" & m1=$!; }
  [ "$QWEN" = 1 ] && { make_model qwen3.6-35b-a3b q4_k_m "$W/qwen3.6-35b-a3b-Q4_K_M.gguf" & m2=$!; }
  [ -z "$m1" ] || { wait $m1 && stamp "Llama F16 written" || { stamp "make-model llama failed"; tail -5 "$F16.log"; }; }
  [ -z "$m2" ] || { wait $m2 && stamp "Qwen3.6 Q4_K_M written" || { stamp "make-model qwen3.6 failed"; tail -5 "$W/qwen3.6-35b-a3b-Q4_K_M.gguf.log"; }; }
  [ -z "$build" ] || { wait $build && stamp "llama.cpp built" || { stamp "llama.cpp build failed"; tail -20 "$W/build.log"; finish; }; }
  for q in $QUANTS; do
    f=$W/llama-3.1-8b-$q.gguf; [ -f "$f" ] && continue
    [ "$(el)" -gt $(( DEADLINE_S - 40 )) ] && { stamp "quantizing left for a later call"; finish; }
    free_gb=$(df --output=avail -BG "$W" | tail -1 | tr -dc 0-9)
    [ "$free_gb" -lt 10 ] && { stamp "no disk for $q (${free_gb} GB free)"; continue; }
    "$LB/llama-quantize" "$F16" "${f%.gguf}.part.gguf" "$q" 16 > "$W/quantize.log" 2>&1 && mv "${f%.gguf}.part.gguf" "$f" \
      && stamp "quantized $q" || { stamp "llama-quantize $q failed"; tail -3 "$W/quantize.log"; }
  done
  rm -f "$F16"
  ls -l "$W"/*.gguf | tee "$R/files.txt"; df -h "$W" | tail -1
  touch "$W/done/files"
fi

measure() {  # measure NAME FILE LEVELS SECONDS_LLAMACPP SECONDS_STAGEWISE
  local name=$1 f=$2 levels=$3 top=${3##*,}
  [ -f "$f" ] || { stamp "no file $f"; return; }
  if step "llamacpp_$name" "$4"; then
    timeout $(( $4 / 2 )) "$LB/llama-bench" -m "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 -o json \
      > "$R/llamabench_$name.json" 2> "$W/lb.err" || tail -3 "$W/lb.err"
    timeout $(( $4 / 2 )) "$LB/llama-batched-bench" -m "$f" -c $(( top * 256 + 1024 )) -b 2048 -ub 512 -npp 128 -ntg 128 \
      -npl "$levels" -ngl 99 -fa on --output-format jsonl 2>&1 | grep '^{"n_kv_max"' > "$R/llamacpp_batched_$name.jsonl"  # its log and rows share a stream
    [ -s "$R/llamacpp_batched_$name.jsonl" ] && touch "$W/done/llamacpp_$name"
  fi
  if step "stagewise_$name" "$5"; then
    timeout $(( $5 * 6 / 10 )) $S bench "$f" --devices cuda:0 --placement single --concurrency "$levels" --prompt 128 --gen 128 \
      --repeats 1 --json > "$R/stagewise_concurrency_$name.json" 2> "$W/sw.err" || { stamp "stagewise rc $? (124: its cap)"; grep -v Warning "$W/sw.err" | tail -4; }
    timeout $(( $5 * 4 / 10 )) $S bench "$f" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
      > "$R/stagewise_single_$name.json" 2> "$W/sw.err" || { stamp "stagewise rc $? (124: its cap)"; grep -v Warning "$W/sw.err" | tail -4; }
    [ -s "$R/stagewise_concurrency_$name.json" ] && [ -s "$R/stagewise_single_$name.json" ] && touch "$W/done/stagewise_$name"
  fi
}
measure llama-3.1-8b-Q4_K_M "$W/llama-3.1-8b-Q4_K_M.gguf" 1,8,32,64 100 220
[ "$QWEN" = 1 ] && measure qwen3.6-35b-a3b-Q4_K_M "$W/qwen3.6-35b-a3b-Q4_K_M.gguf" 1,8,32,64 150 330  # H100: 154 + 17 s
for q in Q6_K IQ4_XS Q5_K_M; do [[ " $QUANTS " == *" $q "* ]] && measure "llama-3.1-8b-$q" "$W/llama-3.1-8b-$q.gguf" 1,32 70 240; done  # IQ4_XS passed 90 + 60 s caps on an H100
if step tests 200; then
  timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_peak_check.py tests/test_fp8_kv.py \
    > "$R/gpu_tests_peak_fp8.txt" 2>&1; tail -15 "$R/gpu_tests_peak_fp8.txt"
  timeout 75 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_packed_kernels.py -k "word and Q4_K" \
    > "$R/gpu_tests_word_gemv.txt" 2>&1; tail -6 "$R/gpu_tests_word_gemv.txt"
  touch "$W/done/tests"
fi
finish
