#!/usr/bin/env bash
# Decode attention split by each row's own length (this tree: one decode graph per shape, warm-up no longer
# captures a graph per attended-length bucket) against the bucket-sliced kernel before it (commit b0913b4),
# on one GPU, in three calls on the same warm machine (< 10 min each). Prepare here first (no device time),
# in the repo root:
#   grep -qx '/.ab_old/' .git/info/exclude || echo /.ab_old/ >> .git/info/exclude
#   rm -rf .ab_old && mkdir .ab_old && git archive b0913b4 stagewise bench/__init__.py bench/warm_up_check.py | tar -x -C .ab_old
# then, each call with carry [".ab_old", ".wheels"]:
#   bash bench/results/warm_up_h200/decode_splits_ab.sh 1   # (1) and (2) at the short context
#   bash bench/results/warm_up_h200/decode_splits_ab.sh 2   # (2) at 32k
#   bash bench/results/warm_up_h200/decode_splits_ab.sh 3   # (3)
# (1) bench/decode_attention_ab.py: µs per layer, old vs new kernel, Llama-8B and Qwen3.6 layer shapes, 1/8/64
# rows at 256 .. 131,072 keys, all rows that long or one long row beside short ones; (2) `stagewise bench`
# decode tok/s of Llama-3.1-8B bf16 (random weights) with each tree, at a short context (208-token prompts,
# 1/8/64 streams) and at 32k (a 32,768-token prompt, 1 and 8 streams), and each tree's warm-up banner
# (bench/warm_up_check.py --bursts 8 at 32k: warm-up seconds, graphs captured): (3).
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
[ -d .ab_old/stagewise ] || { echo "no .ab_old: prepare it first (see the header)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
NEW=$PWD OLD=$PWD/.ab_old
L=random:llama-3.1-8b

kernel_ab() {
  stamp "(1) kernel A/B"
  PYTHONPATH=$NEW:/tmp/site timeout 200 python3 bench/decode_attention_ab.py \
    --old .ab_old/stagewise/kernels/decode_attention_triton.py --out "$O/decode_attention_ab.json" 2>&1 | grep -v Warning
}
decode() {  # tree context prompt streams
  root=$OLD; [ $1 = new ] && root=$NEW
  stamp "(2) $1: decode tok/s at context $2, $3-token prompts, $4 streams"
  PYTHONPATH=$root:/tmp/site timeout 170 python3 -m stagewise bench $L --devices cuda:0 --placement single \
    --context $2 --prompt $3 --gen 128 --concurrency $4 --json > "$O/bench_$1_ctx$2.json" 2> "$O/bench_$1_ctx$2.err"
  tail -c 800 "$O/bench_$1_ctx$2.json"; echo
}
warm() {  # tree: each tree's own warm_up_check (the old one reports buckets, the new one graph lengths)
  root=$OLD; [ $1 = new ] && root=$NEW
  stamp "(3) $1: warm-up at 32k (seconds, graphs captured), then a burst of 8"
  PYTHONPATH=$root:/tmp/site timeout 240 python3 $root/bench/warm_up_check.py $L --devices cuda:0 --placement single \
    --context 33280 --max-seqs 64 --bursts 8 --prompt 208 --gen 32 --json "$O/warm_up_check_$1.json" 2>&1 \
    | grep -v Warning | tail -6
}
case "${1:-1}" in
1) kernel_ab; decode old 4096 208 1,8,64; decode new 4096 208 1,8,64 ;;
2) decode old 33280 32768 1,8; decode new 33280 32768 1,8 ;;
3) warm old; warm new ;;
esac
stamp done
