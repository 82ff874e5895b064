#!/usr/bin/env bash
# llama.cpp's batched-bench beside `stagewise bench --concurrency`, on the same GGUF and machine.
# Usage (repository root, PYTHONPATH=. or installed):
#   bash bench/llamacpp_batched.sh LLAMA_CPP_BUILD MODEL OUTDIR [LEVELS] [PROMPT] [GEN]
#   LLAMA_CPP_BUILD  a llama.cpp build directory holding bin/llama-batched-bench (built with CUDA
#                    for GPU figures: cmake -B build -DGGML_CUDA=ON && cmake --build build -j
#                    --target llama-batched-bench)
#   MODEL            a .gguf file, or a preset (llama-3.1-8b, qwen3-30b-a3b…) written first with
#                    `stagewise make-model --config PRESET --dtype ${DTYPE:-bf16} --device cuda`
#   LEVELS           concurrent sequences, default 1,8,32,64; PROMPT / GEN tokens, default 128 / 128
# Writes OUTDIR/llamacpp_batched.jsonl (llama.cpp's rows: S_TG is its decode rate at batch N) and
# OUTDIR/stagewise_concurrency.json (decode_tokens_per_s per level is the same quantity), then prints
# both side by side. LLAMA_ARGS adds flags to llama-batched-bench (default: -ngl 99 -fa on).
set -euo pipefail
BUILD=${1:?llama.cpp build directory}; MODEL=${2:?GGUF file or preset}; OUT=${3:?output directory}
LEVELS=${4:-1,8,32,64}; PROMPT=${5:-128}; GEN=${6:-128}
BIN="$BUILD/bin/llama-batched-bench"
[ -x "$BIN" ] || { echo "llamacpp_batched.sh: $BIN not found (build the llama-batched-bench target)" >&2; exit 2; }
mkdir -p "$OUT"
if [ ! -f "$MODEL" ]; then
  GGUF="$OUT/$MODEL-${DTYPE:-bf16}.gguf"
  python3 -m stagewise make-model --config "$MODEL" --dtype "${DTYPE:-bf16}" --device "${MAKE_DEVICE:-cuda}" "$GGUF"
  MODEL=$GGUF
fi
MAX=$(tr ',' '\n' <<<"$LEVELS" | sort -n | tail -1)
CTX=$(( MAX * (PROMPT + GEN) ))
# shellcheck disable=SC2086
"$BIN" -m "$MODEL" -c "$CTX" -b 2048 -ub 512 -npp "$PROMPT" -ntg "$GEN" -npl "$LEVELS" ${LLAMA_ARGS:--ngl 99 -fa on} \
  --output-format jsonl > "$OUT/llamacpp_batched.jsonl"
python3 -m stagewise bench "$MODEL" --concurrency "$LEVELS" --prompt "$PROMPT" --gen "$GEN" --repeats 1 --json \
  > "$OUT/stagewise_concurrency.json"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
ours = {lv["streams"]: lv for lv in json.load(open(f"{out}/stagewise_concurrency.json"))["levels"]}
print(f"{'streams':>8} {'llama.cpp S_TG':>15} {'stagewise decode':>17} {'ratio':>6}")
for line in open(f"{out}/llamacpp_batched.jsonl"):
    if not line.startswith("{"):
        continue  # llama.cpp's log lines
    row = json.loads(line)
    n, theirs = int(row["pl"]), float(row["speed_tg"])
    mine = ours.get(n, {}).get("decode_tokens_per_s")
    print(f"{n:>8} {theirs:>15.1f} {mine if mine is None else round(mine, 1):>17} "
          f"{'' if not mine else round(mine / theirs, 2):>6}")
PY
