#!/usr/bin/env bash
# Call 6 (one H200, < 10 min; 2026-12-05): issue 44's non-finite logits (call5: 57 of 64 streams failed in
# pass 1). The candidate cause found on the CPU (c34ceab): decode graphs baked the addresses of identity
# alignments an LRU later freed. The make-model file, then the server's 64-stream burst twice, each a fresh
# server: (fixed) today's tree with the alignment probe (lru_site: logs any graph alignment freed); (lru) the
# same with STAGEWISE_ALIGN_LRU_ONLY=1, the behaviour before the fix (confirmed if it fails and a
# graph_alignment_freed line precedes its nonfinite_logits line); then, time left, the per-step state probe
# (nan_probe_site) and STAGEWISE_PDL=0. Needs .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; R=bench/results/hybrid_serving_h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
stamp "make-model"
[ -f $F ] || timeout 200 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
ls -l $F || exit 1
for how in fixed lru probe pdl0; do
  left=$(( 480 - ($(date +%s) - t0) )); [ $left -lt 60 ] && break
  stamp "server, 64 streams x2, $how (${left} s left)"
  extra=(); env=()
  [ $how = fixed ] && env=(STAGEWISE_ALIGN_PROBE=$O/align_fixed.jsonl PYTHONPATH=$PWD/$R/lru_site:$PYTHONPATH)
  [ $how = lru ] && env=(STAGEWISE_ALIGN_LRU_ONLY=1 STAGEWISE_ALIGN_PROBE=$O/align_lru.jsonl PYTHONPATH=$PWD/$R/lru_site:$PYTHONPATH)
  [ $how = pdl0 ] && env=(STAGEWISE_PDL=0)
  [ $how = probe ] && env=(STAGEWISE_NAN_PROBE=$O/nan_steps_probe.jsonl STAGEWISE_NAN_PROBE_STEPS=1 PYTHONPATH=$PWD/$R/nan_probe_site:$PYTHONPATH)
  env "${env[@]}" timeout $(( left < 170 ? left : 170 )) python3 bench/serve_load.py $F --devices cuda:0 --placement single \
    --max-seqs 64 --context 4096 --concurrency 64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat \
    --no-in-process --startup-timeout-s 150 "${extra[@]}" > "$O/serve_64_$how.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_64_$how.txt" | tail -4
done
for f in align_fixed align_lru; do echo "== $f"; head -c 1500 $O/$f.jsonl 2>/dev/null; done
head -c 3000 $O/nan_steps_probe.jsonl 2>/dev/null
stamp done
