#!/usr/bin/env bash
# The GPU measurements of docs/performance.md, in one pass on nvidia-h200-x2 (~6 minutes).
# Usage (repository root, PYTHONPATH=. or installed): bash bench/h200_suite.sh OUTDIR
# (SWEEP=1 adds the in-graph GEMV sweep, ~3 minutes more)
# (docs/qualification.md's run: python3 bench/qualify_rfc.py --gguf Q36.gguf, separately)
set -u
OUT=${1:?output directory}
B="python3 -m stagewise bench"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp kernel tests; timeout 150 python3 -m pytest tests/test_triton_kernels.py tests/test_moe_grouped_triton.py -q -p no:cacheprovider 2>&1 | tail -3
stamp exactness; timeout 120 python3 bench/gpu_exact.py random:llama-3.1-8b random:qwen3.5-4b --out "$OUT/gpu_exact_2xh200.json" 2>&1 | grep -E "bit_identical"
timeout 90 python3 bench/gpu_exact.py random:qwen3.5-4b@q8_0 --chunk 32 --out "$OUT/gpu_exact_q8_0_2xh200.json" 2>&1 | grep -E "bit_identical"
L="$B random:llama-3.1-8b --json"
stamp llama decode; timeout 80 $L --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 3 > "$OUT/bench_llama8b_1gpu.json"
timeout 80 $L --devices cuda:0,cuda:1 --placement pipeline:2 --prompt 512 --gen 128 --repeats 3 > "$OUT/bench_llama8b_2gpu_p512.json"
stamp llama prefill; timeout 150 $L --devices cuda:0 --placement single --prompt 2048 --prefill-chunk 2048 --gen 128 --repeats 2 --baseline transformers > "$OUT/bench_llama8b_1gpu_vs_transformers.json"
timeout 80 $L --devices cuda:0,cuda:1 --placement pipeline:2 --prompt 2048 --gen 64 --repeats 3 > "$OUT/bench_llama8b_2gpu_chunk512.json"
stamp qwen3.6; timeout 120 $B random:qwen3.6-35b-a3b@q8_0 --devices cuda:0@22.760GB,cuda:1@22.766GB --placement pipeline:2 --prompt 2048 --gen 128 --repeats 3 --json > "$OUT/bench_qwen36_q8_2gpu_capped.json"
stamp qwen3-30b; Z="$B random:qwen3-30b-a3b@q8_0 --gen 128 --repeats 3 --json"
timeout 90 $Z --devices cuda:0 --placement single --prompt 512 > "$OUT/bench_qwen3_30b_q8_1gpu_p512.json"
timeout 90 $Z --devices cuda:0,cuda:1 --placement pipeline:2 --prompt 512 > "$OUT/bench_qwen3_30b_q8_2gpu_p512.json"
timeout 90 $Z --devices cuda:0 --placement single --prompt 2048 --prefill-chunk 2048 > "$OUT/bench_qwen3_30b_q8_1gpu.json"
stamp dependent launch off and on; A="$L --devices cuda:0 --placement single --prompt 512 --gen 128 --repeats 3"
for p in 0 1; do STAGEWISE_PDL=$p timeout 80 $A > "$OUT/ab_llama8b_1gpu_pdl$p.json"; done
for p in 0 1; do STAGEWISE_PDL=$p timeout 90 $Z --devices cuda:0 --placement single --prompt 512 > "$OUT/ab_qwen3_30b_q8_1gpu_pdl$p.json"; done
P="python3 bench/profile_decode.py random:llama-3.1-8b --context 648"  # the decode benches' context
stamp profiles; timeout 80 $P --devices cuda:0 --placement single --out "$OUT/profile_decode_llama8b_1gpu.json" | tail -12
timeout 80 $P --devices cuda:0,cuda:1 --placement pipeline:2 --out "$OUT/profile_decode_llama8b_2gpu.json" | tail -12
if [ "${SWEEP:-0}" = 1 ]; then stamp gemv graph sweep; timeout 200 python3 bench/gemv_graph.py --out "$OUT/gemv_graph_h200.json" | tail -22; fi
stamp done
for f in "$OUT"/bench_*.json "$OUT"/ab_*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); s=r['stagewise']; print(sys.argv[1].split('/')[-1], {k: s.get(k) for k in ('prefill_tokens_per_s','decode_tokens_per_s','handoff_device_s_per_token','roofline_fraction')}, s['tokens_head'][:4], r.get('ratio_vs_transformers'))" "$f" || tail -c 800 "$f"
done
