#!/usr/bin/env bash
# Issue 48's GPU targets on one H200, in two calls on the same warm machine (< 10 min each):
#   bash bench/results/engine_process_h200/run.sh 1   # worker protocol on the GPU host's CPU; Llama-8B through a local worker
#   bash bench/results/engine_process_h200/run.sh 2   # Llama-8B over HTTP against in process (serve_load, second pass)
# Targets: (1) bench/worker_protocol.py <= 0.3 ms of protocol a step (the 2-core CPU machine: 0.57 ms p10,
# 0.66 ms median, bench/results/worker_plane_cpu); `stagewise bench --workers local` >= 0.9x in process at
# 1, 8 and 32 streams (before: 176 / 1,287 / 4,232 against 239 / 1,672 / 6,190 tok/s, 0.68-0.77x).
# (2) serve_load's output tok/s >= 0.95x the in-process `bench --concurrency` aggregate at 1, 8, 32 and 64
# streams (it runs the in-process bench itself after stopping the server), single-stream inter-token
# latency within 3 % of in process. Needs .wheels carried (as hybrid_serving_h200/call1.sh).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
L=random:llama-3.1-8b
DEV=(--devices cuda:0 --placement single)

case "${1:-1}" in
1)
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc; uptime
  for i in 1 2 3; do
    stamp "worker protocol $i (tiny model, CPU, one local worker)"
    OMP_NUM_THREADS=1 timeout 90 python3 bench/worker_protocol.py --floor --json "$O/worker_protocol_h200host_$i.json" 2>&1 \
      | grep -E '"(in_process|worker)_(p10|median)_ms"'
  done
  for how in inprocess worker; do
    stamp "Llama-8B bf16 (random), bench --concurrency 1,8,32: $how"
    extra=(); [ $how = worker ] && extra=(--workers local)
    timeout 240 python3 -m stagewise bench $L "${DEV[@]}" --concurrency 1,8,32 --prompt 128 --gen 128 --repeats 1 \
      --json "${extra[@]}" > "$O/workers_llama8b_$how.json" 2> "$O/workers_llama8b_$how.err"
    tail -c 600 "$O/workers_llama8b_$how.json"; echo
  done
  ;;
2)
  stamp "Llama-8B bf16 (random): serve, two passes of 1/8/32/64 streams, then the same levels in process"
  timeout 560 python3 bench/serve_load.py $L "${DEV[@]}" --max-seqs 64 --context 4096 --concurrency 1,8,32,64 \
    --prompt 208 --gen 128 --passes 2 --endpoint completions --startup-timeout-s 200 --bench-timeout-s 300 \
    --json "$O/serve_vs_inprocess_llama8b.json" > "$O/serve_vs_inprocess_llama8b.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_vs_inprocess_llama8b.txt" | tail -24
  ;;
esac
stamp done
