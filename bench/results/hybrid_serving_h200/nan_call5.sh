#!/usr/bin/env bash
# Issue 44, one call (< 5 min). nan_call4: serve's warm-up passed on this tree (control), where every serve of the
# last session failed (at 3539077 and before). Alternate the tree the failures were seen on (.ab_prefill = 3539077)
# with this one, twice each. Carry [".wheels", ".ab_prefill"].
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"; t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONUNBUFFERED=1
for pass in 1 2; do
  for side in old new; do
    [ $side = old ] && tree=$PWD/.ab_prefill || tree=$PWD
    stamp "serve $side (pass $pass)"
    PYTHONPATH=$tree:/tmp/site timeout 70 python3 -m stagewise serve random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 \
      --placement single --max-seqs 8 --context 4096 --port $((18200 + RANDOM % 500)) > "$O/serve_${side}_$pass.txt" 2>&1 &
    pid=$!; for i in $(seq 70); do sleep 1; grep -q -E "warmed up|error" "$O/serve_${side}_$pass.txt" && break; done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null; grep -E "warmed up|error" "$O/serve_${side}_$pass.txt" | head -2 | cut -c1-120
  done
done
stamp done
