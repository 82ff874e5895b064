#!/usr/bin/env bash
# Call 7 (one H200, < 10 min; 2026-12-05): issue 44's served figures with this tree (packed steps in graph
# pieces, decode GEMVs rows fastest, identity alignments of captured graphs kept): two passes of
# `stagewise serve` at 8/32/64 streams (208-token prompts, 128 out, fresh prompts per burst, chat), with the
# alignment probe (lru_site/: logs any alignment a graph holds being freed) and the NaN probe off. The
# make-model file is reused when the machine still has it (bench/results/packed_graphs_h200/run.sh makes
# it). Needs .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; R=bench/results/hybrid_serving_h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
stamp "make-model (if absent)"
[ -f $F ] || timeout 220 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
ls -l $F || exit 1
left=$(( 570 - ($(date +%s) - t0) ))
stamp "two passes, 8/32/64 streams (${left} s left)"
STAGEWISE_ALIGN_PROBE=$O/align.jsonl PYTHONPATH=$PWD/$R/lru_site:$PYTHONPATH \
  timeout $left python3 bench/serve_load.py $F --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
  --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat --no-in-process \
  --startup-timeout-s 200 --json $O/serve_two_passes_call7_qwen36_q8_h200.json > $O/serve_two_passes_call7.txt 2>&1
grep -v "^burst .*completed" $O/serve_two_passes_call7.txt | tail -16
echo "== alignment probe"; head -c 1500 $O/align.jsonl 2>/dev/null || echo "no line"
stamp done
