#!/usr/bin/env bash
# Round 3, call 2 (one H200): the Q4_K/Q5_K GEMV slot variants (8/16-byte slots, one FMA a value or a
# dot a slot, the next step read first) swept at 8B's shapes; whole 8B Q4_K decodes with four variants;
# the status page polled beside unpolled runs at 64 streams, 512 tokens out, 4 A B B A rounds (#34).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
stamp packed_gemv variants
timeout 200 python3 bench/packed_gemv.py --types q4_k,q5_k --out "$O/packed_gemv_variants_h200.json" 2>&1 | grep -v Warning | tail -12
for v in "8 0 0" "8 0 1" "16 1 0" "16 0 1"; do
  set -- $v; stamp "bench 8b q4_k, slot variant $v"
  timeout 90 python3 -c "
import sys
import stagewise.kernels.packed_gemv_triton as g
g.SLOT_VARIANT = g.SlotVariant($1, bool($2), bool($3))
from stagewise.cli.main import main
sys.exit(main(['bench', 'random:llama-3.1-8b@q4_k', '--devices', 'cuda:0', '--placement', 'single', '--prompt', '512', '--gen', '128', '--repeats', '2', '--json']))
" > "$O/bench2_q4_k_slot$1_$2_$3.json" 2> "$O/bench.err" || tail -5 "$O/bench.err"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print({k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','roofline_fraction')})" "$O/bench2_q4_k_slot$1_$2_$3.json"
done
stamp serve_load status A/B
timeout 260 python3 bench/serve_load.py random:llama-3.1-8b --devices cuda:0 --placement single --max-seqs 64 \
  --concurrency 64 --prompt 208 --gen 512 --status-poll-s 1 --status-rounds 4 --no-in-process \
  --json "$O/serve_status_ab2_llama8b_h200.json" 2>&1 | tail -16
stamp done
