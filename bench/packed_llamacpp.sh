#!/usr/bin/env bash
# Real files from llama.cpp's own quantizer (issue #29): quantize make-model F16 files with
# llama-quantize, load them in stagewise (assess's prediction beside the measured charge, greedy text
# beside llama-completion's), and time Llama-3.1-8B Q4_K_M with llama-bench / batched-bench beside
# `stagewise bench` on the same file.
# Usage (repository root, on the GPU machine): bash bench/packed_llamacpp.sh LLAMA_BUILD OUTDIR [WORKDIR]
#   LLAMA_BUILD: a CUDA build of llama.cpp holding bin/llama-quantize, llama-completion, llama-bench,
#   llama-batched-bench (../shared/tools/llamacpp-source.sh has the build line).
# Env: PRESETS (tiny presets to quantize), TYPES (llama-quantize types), BIG (reference presets to time).
set -u
BUILD=${1:?llama.cpp build}; OUT=${2:?output directory}; W=${3:-/tmp/packed_llamacpp}
mkdir -p "$OUT" "$W"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
S="python3 -m stagewise"
PROMPT="The quick brown fox"
for preset in ${PRESETS-tiny-llama tiny-qwen3 tiny-qwen3-moe tiny-qwen3.6}; do
  $S make-model --config "$preset" --dtype f16 --seed 1 "$W/$preset-f16.gguf" > /dev/null || continue
  for q in ${TYPES:-Q4_K_M Q5_K_M Q6_K Q4_0 IQ4_XS Q3_K_M Q2_K}; do
    f="$W/$preset-$q.gguf"
    "$BUILD/bin/llama-quantize" "$W/$preset-f16.gguf" "$f" "$q" > "$W/quantize.log" 2>&1 || { echo "$preset $q: quantize failed"; continue; }
    theirs=$(timeout 60 "$BUILD/bin/llama-completion" -m "$f" -p "$PROMPT" -n 12 --temp 0 -no-cnv -ngl 99 2>/dev/null | tr '\n' ' ')
    ours=$(timeout 120 $S run "$f" -p "$PROMPT" --max-tokens 12 --temperature 0 --devices cuda:0 --json 2>&1 | tail -1)
    python3 - "$preset" "$q" "$f" "$theirs" "$ours" "$OUT/llamacpp_files.jsonl" <<'PY'
import json, sys, subprocess
preset, q, f, theirs, ours, out = sys.argv[1:]
row = {"preset": preset, "type": q, "file_bytes": __import__("os").path.getsize(f), "llama_cpp_output": theirs}
try:
    r = json.loads(ours)
    row.update(stagewise_text=r.get("text"), stagewise_tokens=r.get("tokens"),
               charged_weights_bytes=sum(s["charge"]["weights_bytes"] for s in r["placement"]["stages"]))
    row["text_matches"] = bool(r.get("text")) and r["text"].strip() in theirs
except Exception as e:  # noqa: BLE001
    row["stagewise_error"] = ours[-400:]
print(json.dumps(row)); open(out, "a").write(json.dumps(row) + "\n")
PY
  done
done
for big in ${BIG-llama-3.1-8b}; do
  stamp "$big: f16 file"; $S make-model --config "$big" --dtype f16 --seed 0 --device cuda "$W/$big-f16.gguf" > /dev/null
  for q in ${BIG_TYPES:-Q4_K_M}; do
    f="$W/$big-$q.gguf"; stamp "$big $q: quantize"
    "$BUILD/bin/llama-quantize" "$W/$big-f16.gguf" "$f" "$q" 16 > "$W/quantize_big.log" 2>&1 || { tail -3 "$W/quantize_big.log"; continue; }
    stamp "$big $q: llama-bench"
    "$BUILD/bin/llama-bench" -m "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 -o json > "$OUT/llamabench_${big}_${q}.json" 2>/dev/null
    stamp "$big $q: stagewise bench"
    timeout 200 $S bench "$f" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
      > "$OUT/stagewise_${big}_${q}.json" 2> "$W/bench.err" || tail -5 "$W/bench.err"
    $S assess "$f" --devices cuda:0 --json > "$OUT/assess_${big}_${q}.json" 2>&1
    if [ -n "${CONCURRENCY:-}" ]; then
      stamp "$big $q: batched"
      "$BUILD/bin/llama-batched-bench" -m "$f" -c $((64 * 256)) -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$CONCURRENCY" -ngl 99 -fa on \
        --output-format jsonl > "$OUT/llamacpp_batched_${big}_${q}.jsonl" 2>/dev/null
      timeout 200 $S bench "$f" --devices cuda:0 --placement single --concurrency "$CONCURRENCY" --prompt 128 --gen 128 --repeats 1 --json \
        > "$OUT/stagewise_concurrency_${big}_${q}.json" 2> "$W/conc.err" || tail -5 "$W/conc.err"
    fi
  done
  rm -f "$W/$big-f16.gguf"
done
stamp done
