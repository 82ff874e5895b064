#!/usr/bin/env bash
# For the next session's first two device calls (carry .wheels; `bash next_call.sh 1`, then `... 2` on the warm machine): issue 44's next lever, issue 48's worker figures, issue 47's first burst.
#  1. constant_ab.py: GATHER_MAX_SLOTS at 64 (today), 32, 16, 8 on random Qwen3.6-35B-A3B Q8_0 (decode 1/2/4/8/16);
#  2. Llama-8B bf16 through one local worker against in process, after WorkerTokens (1 / 8 / 32 streams), and the
#     worker protocol on the GPU host (engine_process_h200/run.sh 1's first half).
set -u
O=${OUT:-/tmp/out}; R=/tmp/next_call; mkdir -p "$O" "$R"  # every file into one results.tgz (at most 8 come back)
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$R/machine.txt"
if [ "${1:-1}" = 1 ]; then  # part 1, ~5 min: the A/Bs
for m in 64 8 16 32; do
  timeout 120 python3 bench/results/hybrid_serving_h200/session15/constant_ab.py random:qwen3.6-35b-a3b@q8_0 \
    --set stagewise.models.layers.experts.GATHER_MAX_SLOTS=$m 2>&1 | grep '"set"' | tee -a "$R/gather_ab.jsonl"
done
# the same for K-quant stacks (9-64 slots: kernel A's blocks with SiLU·up and the combine apart, or the grouped
# path's fused ones); Q4_K random weights
for m in 64 8; do
  timeout 150 python3 bench/results/hybrid_serving_h200/session15/constant_ab.py random:qwen3.6-35b-a3b@q4_k \
    --set stagewise.models.layers.experts.GATHER_MAX_SLOTS=$m 2>&1 | grep '"set"' | tee -a "$R/gather_ab_q4k.jsonl"
done
fi
if [ "${1:-1}" = 2 ]; then  # part 2, ~6 min: workers, the first burst, issue 46's speed check
for how in inprocess worker; do
  extra=(); [ $how = worker ] && extra=(--workers local)
  timeout 90 python3 -m stagewise bench random:llama-3.1-8b --devices cuda:0 --placement single --concurrency 1,8,32 \
    --prompt 128 --gen 128 --repeats 1 --json "${extra[@]}" > "$R/workers_llama8b_$how.json" 2> "$R/workers_llama8b_$how.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], [(r['streams'], round(r['decode_tokens_per_s'],1)) for r in d['levels']])" \
    "$R/workers_llama8b_$how.json" $how || tail -3 "$R/workers_llama8b_$how.err"
done
OMP_NUM_THREADS=1 timeout 40 python3 bench/worker_protocol.py --floor --json "$R/worker_protocol.json" 2>&1 | grep -E '_median_ms'
# 3. issue 47: what the first 8-stream burst after warm-up pays on the host that the second does not
timeout 150 python3 bench/warm_up_check.py random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 --context 4096 --max-seqs 16 \
  --bursts 8,8 --prompt 216 --gen 16 --host-profile 20 --json "$R/warm_up_check_host_profile.json" 2>&1 | grep -v Warn | tail -30
# 4. issue 46's last target (no speed regression, before: Qwen3.6 Q8_0 prefill 7,763 / decode 411.4 tok/s; Llama-3.1-8B
#    40,921 / 240.4, on an H200): the same commands as fit_context_h200/run.sh step 4
timeout 70 python3 -m stagewise bench random:qwen3.6-35b-a3b@q8_0 --devices cuda:0 --placement single --prompt 2048 \
  --gen 128 --repeats 3 --json > "$R/bench_qwen36_q8_1gpu.json" 2> /dev/null
timeout 50 python3 -m stagewise bench random:llama-3.1-8b --json --devices cuda:0 --placement single --prompt 512 \
  --gen 128 --repeats 3 > "$R/bench_llama8b_1gpu.json" 2> /dev/null
for f in "$R"/bench_qwen36_q8_1gpu.json "$R"/bench_llama8b_1gpu.json; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print(sys.argv[1].split('/')[-1], {k: round(s[k], 1) for k in ('prefill_tokens_per_s','decode_tokens_per_s')})" "$f"
done
# 5. issue 45: Qwen3.6 Q4_K_M decoded 312 tok/s after a 512-token prompt (358 on 12-06) but 374 after 128: does the
#    prompt's length move one stream's decode? (random Q4_K weights, both lengths, one process each)
for n in 128 512; do
  timeout 60 python3 -m stagewise bench random:qwen3.6-35b-a3b@q4_k --devices cuda:0 --placement single --prompt $n \
    --gen 128 --repeats 2 --json > "$R/bench_qwen36_q4k_prompt$n.json" 2> /dev/null
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stagewise']; print(sys.argv[1].split('/')[-1], round(s['decode_tokens_per_s'], 1))" \
    "$R/bench_qwen36_q4k_prompt$n.json"
done
fi
tar czf "$O/results.tgz" -C "$R" .
