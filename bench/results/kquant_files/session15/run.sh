#!/usr/bin/env bash
# Session 15 (2026-12-07): stagewise alone on the K-quant files after kernel A/B's PTX rework (2026-12-06/07),
# to set beside the llama.cpp figures of the same card type measured on 2026-12-06 (../h100/), and where an
# 8-stream decode step's time goes now (Qwen3.6 Q8_0 after GEMV_MAX_TOKENS 2; Llama-8B and Qwen3.6 Q4_K_M).
# Files from make-model (`--dtype q4_k_m`: llama.cpp's Q4_K_M mix, spec/quant_presets.py), no llama.cpp build.
# Resumable over calls of one warm machine (markers in /tmp/s15/done). Carry [".wheels"].
# Usage (repository root, GPU machine): DEADLINE_S=560 bash bench/results/kquant_files/session15/run.sh
set -u
source bench/device_steps.sh
steps_setup /tmp/s15
S="python3 -m stagewise"; L=$W/llama-3.1-8b-Q4_K_M.gguf; Q=$W/qwen3.6-35b-a3b-Q4_K_M.gguf
finish() { tar czf "$O/results.tgz" -C "$W" results; stamp "call done"; exit 0; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/machine.txt"
if step profile_q8_8 120; then
  timeout 150 python3 bench/profile_batch.py random:qwen3.6-35b-a3b@q8_0 --streams 8 \
    --json "$R/profile_batch_qwen36_q8_8.json" 2>&1 | grep -v Warning | head -n 26
  touch "$W/done/profile_q8_8"
fi
if step files 300; then
  make_model llama-3.1-8b q4_k_m "$L" 200 & m1=$!
  make_model qwen3.6-35b-a3b q4_k_m "$Q" 400 & m2=$!
  wait $m1 && stamp "Llama Q4_K_M written" || tail -3 "$L.log"
  wait $m2 && stamp "Qwen3.6 Q4_K_M written" || tail -3 "$Q.log"
  [ -f "$L" ] && [ -f "$Q" ] && touch "$W/done/files"
fi
[ -e "$W/done/files" ] || finish
bench() {  # bench NAME FILE SECONDS
  if step "sw_$1" "$3"; then
    timeout $(( $3 * 6 / 10 )) $S bench "$2" --devices cuda:0 --placement single --concurrency 1,8,32,64 --prompt 128 \
      --gen 128 --repeats 1 --json > "$R/stagewise_concurrency_$1.json" 2> "$W/sw.err" || { stamp "rc $?"; grep -v Warning "$W/sw.err" | tail -4; }
    timeout $(( $3 * 4 / 10 )) $S bench "$2" --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 2 --json \
      > "$R/stagewise_single_$1.json" 2> "$W/sw.err" || { stamp "rc $?"; grep -v Warning "$W/sw.err" | tail -4; }
    [ -s "$R/stagewise_concurrency_$1.json" ] && touch "$W/done/sw_$1"
    python3 - "$R/stagewise_concurrency_$1.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("unreadable", e); sys.exit()
for r in d.get("levels", d if isinstance(d, list) else []):
    print({k: r[k] for k in r if "tok" in k or k in ("concurrency", "streams")})
PY
  fi
}
bench llama-3.1-8b-Q4_K_M "$L" 260
bench qwen3.6-35b-a3b-Q4_K_M "$Q" 560
if step profile_kq_8 150; then
  timeout 70 python3 bench/profile_batch.py "$L" --streams 8 --json "$R/profile_batch_llama8b_q4km_8.json" 2>&1 | grep -v Warning | head -n 18
  timeout 80 python3 bench/profile_batch.py "$Q" --streams 8 --json "$R/profile_batch_qwen36_q4km_8.json" 2>&1 | grep -v Warning | head -n 22
  touch "$W/done/profile_kq_8"
fi
finish
