#!/usr/bin/env bash
# Call 6 (one H200, < 10 min; 2026-12-05): bisect issue 44's non-finite logits (call5: 57 of 64 streams failed
# in pass 1). The make-model file, then in process (nan_probe.py on the file, 128 out, prompts sharing a
# 70-token head as serve_load's chat prompts share the template's: prefix cache on, then off), then the
# server's 64-stream burst with --no-prefix-cache and with STAGEWISE_PDL=0. Needs .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; R=bench/results/hybrid_serving_h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
stamp "make-model"
[ -f $F ] || timeout 200 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
ls -l $F || exit 1
stamp "in process, the file, 128 out, 70-token shared head: cache, nocache"
MODEL=$F GEN=128 HEAD=70 PASSES=1 VARIANTS=cache,nocache timeout 230 python3 $R/nan_probe.py 2>&1 | grep -v Warn | tail -12 | tee "$O/nan_probe_file.txt"
for how in nocache pdl0; do
  left=$(( 590 - ($(date +%s) - t0) )); [ $left -lt 60 ] && break
  stamp "server, 64 streams x2, $how (${left} s left)"
  extra=(); env=(); [ $how = nocache ] && extra=(--serve-arg=--no-prefix-cache); [ $how = pdl0 ] && env=(STAGEWISE_PDL=0)
  env "${env[@]}" timeout $(( left < 150 ? left : 150 )) python3 bench/serve_load.py $F --devices cuda:0 --placement single \
    --max-seqs 64 --context 4096 --concurrency 64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat \
    --no-in-process --startup-timeout-s 120 "${extra[@]}" > "$O/serve_64_$how.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_64_$how.txt" | tail -4
done
stamp done
