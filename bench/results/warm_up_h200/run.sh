#!/usr/bin/env bash
# Issue 47 (warm-up covers every shape) on one H200, in four calls on the same warm machine (< 10 min each):
#   bash bench/results/warm_up_h200/run.sh 1   # make-model writes the Qwen3.6-35B-A3B Q8_0 file; the variant-log test
#   bash bench/results/warm_up_h200/run.sh 2   # Llama-3.1-8B bf16 (random weights): (a), (c)
#   bash bench/results/warm_up_h200/run.sh 3   # Llama: (b); Qwen3.6 Q8_0 (the file): (a)
#   bash bench/results/warm_up_h200/run.sh 4   # Qwen3.6: (b), (c)
# (make-model runs alone: nothing else on the GPU while a pass is timed.)
# Each model: (a) bench/warm_up_check.py in process: warm-up's time and what it compiled/captured, then the
# kernels compiled and graphs captured during bursts of 8/32/64 x 208-token prompts (128 out) and a mixed
# burst after it (target: 0 and 0); (b) bench/serve_load.py --passes 2 at 8/32/64 streams (208-token prompts,
# 128 out, fresh prompts, chat): first burst after ready vs the second pass on the same server (before this
# work, Llama: 802 -> 1,285 tok/s at 8, 1,119 -> 2,863 at 32, 1,726 -> 4,299 at 64; TTFT p50 0.57 -> 0.20 s at
# 8); the server's "warmed up in ..." banner is kept; (c) one 4,113-token prompt alone, twice, fresh prompts
# (cold vs warm TTFT; before: 0.94 s cold). Needs .wheels carried (as hybrid_serving_h200/call1.sh).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
W=/tmp/w; mkdir -p $W; Q=$W/qwen3.6-35b-a3b-Q8_0.gguf
CTX=16384  # a 12,442-token prompt fits (the issue's); 18 attended-length buckets
# on an H100 (80 GB) Llama's 64 rows of 16,384 positions (137 GB of KV) do not fit: KVT=262144 bash run.sh N
# shares a pool of that many positions among the rows (serve's --kv-tokens)
KV_ARGS=(); SERVE_KV=(); [ -n "${KVT:-}" ] && KV_ARGS=(--kv-tokens "$KVT") && SERVE_KV=(--serve-arg=--kv-tokens --serve-arg="$KVT")

check() {  # name model: (a)
  stamp "$1: in process, warm-up then bursts (kernels compiled, graphs captured)"
  timeout 230 python3 bench/warm_up_check.py "$2" --devices cuda:0 --placement single --context $CTX \
    --max-seqs 64 "${KV_ARGS[@]}" --bursts 8,32,64 --prompt 208 --gen 128 --json "$O/warm_up_check_$1.json" 2>&1 \
    | grep -v Warning | tail -12
}
passes() {  # name model: (b)
  stamp "$1: serve, two passes of 8/32/64 streams"
  timeout 300 python3 bench/serve_load.py "$2" --devices cuda:0 --placement single --max-seqs 64 "${SERVE_KV[@]}" \
    --context $CTX --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat \
    --no-in-process --startup-timeout-s 200 --json "$O/serve_two_passes_$1.json" > "$O/serve_two_passes_$1.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_two_passes_$1.txt" | tail -16
}
long_prompt() {  # name model: (c)
  stamp "$1: serve, a 4,113-token prompt alone, cold then warm"
  timeout 150 python3 bench/serve_load.py "$2" --devices cuda:0 --placement single --max-seqs 64 "${SERVE_KV[@]}" \
    --context $CTX --concurrency 1 --prompt 4113 --gen 16 --passes 2 --fresh-prompts --endpoint completions \
    --no-in-process --startup-timeout-s 120 --json "$O/serve_4k_cold_warm_$1.json" > "$O/serve_4k_cold_warm_$1.txt" 2>&1
  grep -v "^burst .*completed" "$O/serve_4k_cold_warm_$1.txt" | tail -8
}
L=random:llama-3.1-8b

case "${1:-1}" in
1)
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  stamp "the variant-log test on the GPU (kernels compiled, not interpreted)"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_warm_up_coverage.py -k variant_log 2>&1 | tail -3
  stamp "make-model: Qwen3.6-35B-A3B Q8_0"
  timeout 500 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 --device cuda $Q 2>&1 | tail -3
  ls -l $Q
  ;;
2) check llama8b_bf16 $L; long_prompt llama8b_bf16 $L ;;
3) passes llama8b_bf16 $L; ls -l $Q && check qwen36_q8 $Q ;;
4) ls -l $Q && passes qwen36_q8 $Q && long_prompt qwen36_q8 $Q ;;
esac
stamp done
