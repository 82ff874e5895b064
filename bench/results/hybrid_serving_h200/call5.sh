#!/usr/bin/env bash
# Call 5 (one H200, < 10 min; 2026-12-05): issue 44's 64-stream non-finite logits, with issue 48's worker
# protocol timed on the GPU host's CPU meanwhile. The Qwen3.6-35B-A3B Q8_0 file by make-model (GPU) while
# bench/worker_protocol.py runs three times (CPU only, one thread); then call3's two passes of stagewise serve
# (8/32/64 streams, 208-token prompts, 128 out, fresh prompts per burst, chat) with the NaN probe
# (nan_probe_site/) in the served engine; then a packed prefill step's profile (128 tokens) with what is left.
# Needs .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; R=bench/results/hybrid_serving_h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
( for i in 1 2 3; do OMP_NUM_THREADS=1 timeout 80 python3 bench/worker_protocol.py \
    --json "$O/worker_protocol_h200host_$i.json" > "$O/worker_protocol_h200host_$i.txt" 2>&1; done ) &
stamp "make-model (worker protocol x3 on the CPU meanwhile)"
timeout 330 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
tail -1 /tmp/make_model.log; ls -l $F || exit 1
wait; grep -hE '"(in_process|worker)_(p10|median)_ms"' "$O"/worker_protocol_h200host_*.json
stamp "two passes with the NaN probe"
STAGEWISE_NAN_PROBE=$O/nan_server_probe.jsonl PYTHONPATH=$PWD/$R/nan_probe_site:$PYTHONPATH \
  timeout 250 python3 bench/serve_load.py $F --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
  --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat --no-in-process \
  --startup-timeout-s 200 --json $O/serve_two_passes_probe_qwen36_q8_h200.json > $O/serve_two_passes_probe.txt 2>&1
grep -v "^burst .*completed" $O/serve_two_passes_probe.txt | tail -14
head -c 5000 $O/nan_server_probe.jsonl 2>/dev/null || echo "no non-finite logits"
left=$(( 585 - ($(date +%s) - t0) ))
if [ $left -gt 60 ]; then
  stamp "prefill profile, 128 tokens (${left} s left)"
  PROMPT=128 timeout $left python3 $R/prefill_profile.py $F 2>&1 | tail -34 > "$O/prefill_profile_128.txt"; tail -20 "$O/prefill_profile_128.txt"
fi
stamp done
