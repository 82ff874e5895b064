#!/usr/bin/env bash
# Issue 44's figures on one warm GPU machine, over several calls of this script (each runs the steps not yet done,
# none that would end past DEADLINE_S seconds into the call; every result so far comes back as $OUT/results.tgz).
# Carry [".wheels", ".llamacpp-bin"] (`bash bench/llamacpp_prebuild.sh`: llama.cpp built on the CPU machine), or [".wheels",
# ".llamacpp"] (`../shared/tools/llamacpp-source.sh .llamacpp`: built here, ~6 min beside make-model).
#   files    llama.cpp built (llama-server, llama-batched-bench) and make-model's Qwen3.6-35B-A3B Q8_0, both started in
#            the background by the first call (the check of 729dc19's fix ran in session 14 and left this script);
#   served   `bench/serve_load.py FILE --max-seqs 64`, 8/32/64 streams, 208-token prompts, 128 out, fresh prompts,
#            chat, two passes, beside `llama-server -np 64 -fa on` (tokens from the usage chunk, no logprobs);
#   inproc   `stagewise bench FILE --concurrency 1,8,32,64 --prompt 128 --gen 128` beside llama-batched-bench;
#   agents   (AGENTS=1) 16 clients x 10 turns on a 4,000-token system prompt: prefix cache on, off, and llama-server.
# Usage (repository root, GPU machine): DEADLINE_S=560 bash bench/results/hybrid_serving_h200/served.sh
# LLAMA_EXTRA="--cache-ram 0" (with `rm -f /tmp/hs/done/served`): the served step's control run. By default llama-server
# saves every idle slot to its host prompt cache at each new task (tools/server/server-context.cpp, cache_idle_slots):
# the likely cause of its second pass waiting 22-26 s for each first token after 64 slots hold a hybrid's state.
set -u
source bench/device_steps.sh  # steps_setup WORK_DIR; step NAME SECONDS; stamp; el; llamacpp_build; make_model
steps_setup "${HS_WORK:-/tmp/hs}"
LB=/tmp/lb/bin; S="python3 -m stagewise"; F=$W/qwen3.6-35b-a3b-Q8_0.gguf; H=bench/results/hybrid_serving_h200
finish() { tar czf "$O/results.tgz" -C "$W" results; stamp "call done"; exit 0; }

# The files are made in the background from the first call on (setsid: they outlive the call while the machine is
# warm): llama.cpp's build at once, make-model once the check has left the GPU.
if [ ! -e "$W/done/files" ] && [ ! -e "$W/files_started" ]; then
  touch "$W/files_started"; export W F
  [ -x "$LB/llama-server" ] || setsid bash -c 'source bench/device_steps.sh; llamacpp_build 12 llama-server llama-batched-bench' \
    > "$W/build.log" 2>&1 < /dev/null &
  [ -f "$F" ] || setsid bash -c 'source bench/device_steps.sh; make_model qwen3.6-35b-a3b q8_0 "$F" 420' \
    > /dev/null 2>&1 < /dev/null &
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$R/machine.txt"
if step files 60; then  # waits for the background work while the call has time
  while { [ ! -f "$F" ] || [ ! -x "$LB/llama-server" ] || [ ! -x "$LB/llama-batched-bench" ]; } && [ $(( $(el) + 30 )) -lt "$DEADLINE_S" ]; do
    sleep 5
  done
  [ -f "$F" ] && stamp "Qwen3.6 Q8_0 written" || tail -n 5 "$F.log"
  [ -x "$LB/llama-batched-bench" ] && stamp "llama.cpp built" || tail -n 5 "$W/build.log"
  [ -f "$F" ] && [ -x "$LB/llama-server" ] && [ -x "$LB/llama-batched-bench" ] && touch "$W/done/files"
fi
[ -e "$W/done/files" ] || finish
if step served 420; then
  timeout 400 python3 bench/serve_load.py "$F" --devices cuda:0 --placement single --max-seqs 64 --context 4096 \
    --concurrency 8,32,64 --prompt 208 --gen 128 --passes 2 --fresh-prompts --endpoint chat --no-in-process \
    --startup-timeout-s 200 --peer "$LB/llama-server -ngl 99 -fa on -np 64 -c 262144${LLAMA_EXTRA:+ $LLAMA_EXTRA}" \
    --json "$R/serve_peer_two_passes_qwen36_q8.json" > "$R/serve_peer_two_passes_qwen36_q8.txt" 2>&1
  grep -v "^burst .*completed" "$R/serve_peer_two_passes_qwen36_q8.txt" | tail -20
  [ -s "$R/serve_peer_two_passes_qwen36_q8.json" ] && touch "$W/done/served"
fi
if step inproc 300; then
  timeout 120 "$LB/llama-batched-bench" -m "$F" -c 17408 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32,64 -ngl 99 -fa on \
    --output-format jsonl 2>&1 | grep '^{"n_kv_max"' > "$R/llamacpp_batched_qwen36_q8.jsonl"
  timeout 170 $S bench "$F" --devices cuda:0 --placement single --concurrency 1,8,32,64 --prompt 128 --gen 128 --repeats 2 \
    --json > "$R/stagewise_concurrency_qwen36_q8.json" 2> "$W/sw.err" || grep -v Warning "$W/sw.err" | tail -4
  [ -s "$R/stagewise_concurrency_qwen36_q8.json" ] && touch "$W/done/inproc"
fi
if [ "${AGENTS:-0}" = 1 ] && step agents 420; then  # measured in session 11 (met); AGENTS=1 runs it again
  timeout 400 python3 bench/prefix_cache_load.py "$F" --devices cuda:0 --placement single --max-seqs 16 --context 16384 \
    --vocab 32000 --agents 16 --agent-turns 10 --agent-system 4000 --chat-system 1500 --turns 10 --question 200 \
    --gen 32 --peer "$LB/llama-server -ngl 99 -fa on -np 16 -c 262144" \
    --json "$R/prefix_cache_agents_qwen36_q8.json" > "$R/prefix_cache_agents_qwen36_q8.txt" 2>&1
  tail -14 "$R/prefix_cache_agents_qwen36_q8.txt"
  [ -s "$R/prefix_cache_agents_qwen36_q8.json" ] && touch "$W/done/agents"
fi
finish
