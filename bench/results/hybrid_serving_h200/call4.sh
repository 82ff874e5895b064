#!/usr/bin/env bash
# Call 4 (one H200, ~9 min; next session): issue 44's open GPU items. Qwen3.6-35B-A3B Q8_0 by make-model
# in the background; meanwhile nothing GPU-heavy. Then (1) where a packed prefill step's time goes
# (prefill_profile.py, 128- and 512-token prompts), (2) call3's two passes of stagewise serve alone (8/32/64
# streams, 208-token prompts, 128 out, fresh prompts per burst) with the NaN probe (nan_probe_site/) in the
# served engine: the first non-finite block output of an eager step and the state at the first non-finite
# logits go to nan_server_probe.jsonl. Needs .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
W=/tmp/w; mkdir -p $W; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; R=bench/results/hybrid_serving_h200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
stamp "make-model"
timeout 480 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $F > /tmp/make_model.log 2>&1
tail -1 /tmp/make_model.log; ls -l $F || exit 1
for p in 128 512; do
  stamp "prefill profile, $p tokens"
  PROMPT=$p timeout 150 python3 $R/prefill_profile.py $F 2>&1 | tail -34 | tee "$O/prefill_profile_$p.txt"
done
stamp "two passes with the NaN probe"
STAGEWISE_NAN_PROBE=$O/nan_server_probe.jsonl PYTHONPATH=$PWD/$R/nan_probe_site:$PYTHONPATH \
  timeout 260 python3 bench/serve_load.py $F --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
  --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat --no-in-process \
  --startup-timeout-s 200 --json $O/serve_two_passes_probe_qwen36_q8_h200.json > $O/serve_two_passes_probe.txt 2>&1
grep -v "^burst .*completed" $O/serve_two_passes_probe.txt | tail -12
head -c 6000 $O/nan_server_probe.jsonl 2>/dev/null || echo "no non-finite logits"
if [ -x build/lb/bin/llama-server ]; then  # built by call1.sh on this warm machine
  stamp "agents: 16 clients x 10 turns on a 4,000-token system prompt, cache on / off / llama-server"
  timeout 300 python3 bench/prefix_cache_load.py $F --devices cuda:0 --placement single --max-seqs 16 --context 16384 \
    --vocab 32000 --agents 16 --agent-turns 10 --agent-system 4000 --chat-system 1500 --turns 10 --question 200 \
    --gen 32 --peer "build/lb/bin/llama-server -ngl 99 -fa on -np 16 -c 262144" \
    --json $O/prefix_cache_agents_qwen36_q8_h200.json 2>&1 | tail -12
fi
stamp done
