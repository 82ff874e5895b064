#!/usr/bin/env bash
# Session 18's device calls (carry [".wheels", ".llamacpp-bin"], or ".llamacpp" to build it there as served.sh says; run
# again on the same warm machine until "all done";
# DEADLINE_S, default 570, bounds each call). On an H200, issue 44's figures first: served.sh's files (started in the
# background, the compiled kernels' GPU tests beside make-model), served, inproc, then Llama-3.1-8B bf16 served twice
# (after_rows.sh's llama_passes: the "no regression" target); then the kernel tests and A/Bs
# (kquant_files/session20/call.sh).
# On an H100 (issue 44's H100 figures are session 17's) the A/B comes first.
set -u
D=${DEADLINE_S:-570}; t0=$(date +%s); O=${OUT:-/tmp/out}; mkdir -p "$O" /tmp/s18/done
left() { echo $(( D - ($(date +%s) - t0) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
hs() { [ -e /tmp/hs/done/inproc ] && return 0; DEADLINE_S=$(left) bash bench/results/hybrid_serving_h200/served.sh; }
llama() {
  [ -e /tmp/after_rows/done/llama_passes ] && return 0
  mkdir -p /tmp/after_rows/done; touch /tmp/after_rows/done/qwen_inproc
  DEADLINE_S=$(left) bash bench/results/hybrid_serving_h200/after_rows.sh
  mkdir -p /tmp/hs/results && cp "$O"/serve_two_passes_llama8b_bf16.* /tmp/hs/results/ 2>/dev/null
}
ab() { DEADLINE_S=$(left) bash bench/results/kquant_files/session20/call.sh 2>&1 | tee -a /tmp/s18/ab.log; }
if [[ $gpu == *H200* ]]; then
  [ -e /tmp/hs/files_started ] || DEADLINE_S=1 bash bench/results/hybrid_serving_h200/served.sh > /dev/null
  if [ ! -e /tmp/s18/done/tests ]; then  # beside make-model: correctness only, no timing
    export PYTHONPATH=$PWD:/tmp/site
    timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_packed_decode.py -k compiled 2>&1 \
      | tail -8 | tee /tmp/s18/gpu_tests_packed_decode.txt
    touch /tmp/s18/done/tests
  fi
  hs; [ -e /tmp/hs/done/inproc ] && llama; [ -e /tmp/after_rows/done/llama_passes ] && ab
else
  ab
fi
# issue 45's GPU suite as a whole, in one process, once the A/B is done (recorded with its command and card)
if grep -q "all done" /tmp/s18/ab.log 2>/dev/null && [ ! -e /tmp/s18/done/suite ] && [ "$(left)" -gt 240 ]; then
  card=$(echo "$gpu" | grep -o 'H[0-9]00' | tr 'H' 'h'); f=/tmp/s18/gpu_suite_$card.txt
  echo "\$ python3 -m pytest -m gpu tests -p no:cacheprovider -q -rfE  # $(date -u +%FT%TZ), $gpu" > "$f"
  PYTHONPATH=$PWD:/tmp/site timeout $(( $(left) - 20 )) python3 -m pytest -m gpu tests -p no:cacheprovider -q -rfE \
    >> "$f" 2>&1; echo "exit status $?" >> "$f"; tail -15 "$f"; touch /tmp/s18/done/suite
  tar czf "$O/kquant_s18.tgz" -C /tmp/s18 --exclude done .
fi
[ -e /tmp/hs/results ] && tar czf "$O/results.tgz" -C /tmp/hs results
echo "call ended at $(( $(date +%s) - t0 )) s"
