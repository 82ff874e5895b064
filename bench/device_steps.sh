#!/usr/bin/env bash
# Sourced by a device script that runs over several calls of one warm machine: `steps_setup WORK_DIR` begins a call
# ($O the returned files, $W the work folder kept between calls, $R its results, $W/done the finished steps' markers,
# the carried wheels installed into /tmp/site once, the clock $t0); `step NAME SECONDS` is true when NAME is not done
# and SECONDS more end before DEADLINE_S (default 560) seconds into the call, and says which; `stamp` echoes with the
# call's seconds into $R/log.txt too.
steps_setup() {
  O=${OUT:-/tmp/out}; W=$1; R=$W/results; mkdir -p "$O" "$R" "$W/done"
  DEADLINE_S=${DEADLINE_S:-560}
  t0=$(date +%s)
  [ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .wheels/*.whl 2>&1 | tail -1
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
}
el() { echo $(( $(date +%s) - t0 )); }
stamp() { echo "[$(el) s] $*" | tee -a "$R/log.txt"; }
step() {
  [ -e "$W/done/$1" ] && return 1
  [ $(( $(el) + $2 )) -gt "$DEADLINE_S" ] && { stamp "left for a later call: $1 (~$2 s)"; return 1; }
  stamp "$1"
}
