#!/usr/bin/env bash
# Sourced by a device script that runs over several calls of one warm machine: `steps_setup WORK_DIR` begins a call
# ($O the returned files, $W the work folder kept between calls, $R its results, $W/done the finished steps' markers,
# the carried wheels installed into /tmp/site once, the clock $t0); `step NAME SECONDS` is true when NAME is not done
# and SECONDS more end before DEADLINE_S (default 560) seconds into the call, and says which; `stamp` echoes with the
# call's seconds into $R/log.txt too; `llamacpp_build` and `make_model` (below) make the files such scripts time.
steps_setup() {
  O=${OUT:-/tmp/out}; W=$1; R=$W/results; mkdir -p "$O" "$R" "$W/done"
  DEADLINE_S=${DEADLINE_S:-560}
  t0=$(date +%s)
  [ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .wheels/*.whl 2>&1 | tail -1
  export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
  # cuBLAS for a carried llama.cpp build (linked on the CPU machine): the toolkit's, else torch's wheel's
  local torch_libs
  torch_libs=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64${torch_libs:+:$torch_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}
el() { echo $(( $(date +%s) - t0 )); }
stamp() { echo "[$(el) s] $*" | tee -a "$R/log.txt"; }
step() {
  [ -e "$W/done/$1" ] && return 1
  [ $(( $(el) + $2 )) -gt "$DEADLINE_S" ] && { stamp "left for a later call: $1 (~$2 s)"; return 1; }
  stamp "$1"
}
# `llamacpp_build JOBS TARGET...`: llama.cpp from .llamacpp (`../shared/tools/llamacpp-source.sh .llamacpp`, carried)
# built for sm_90a into /tmp/lb (binaries in /tmp/lb/bin), no web UI, curl or OpenSSL. Where a build made on the CPU
# machine is carried as .llamacpp-bin (`bench/llamacpp_prebuild.sh`: the same targets and flags, libraries found
# beside the binaries), it is unpacked instead: the device minutes of the build are saved.
llamacpp_build() {
  local jobs=$1; shift
  if [ -f .llamacpp-bin/bin.tar.xz ]; then
    mkdir -p /tmp/lb/bin && tar xJf .llamacpp-bin/bin.tar.xz -C /tmp/lb/bin && echo "llama.cpp: the carried build"
    return
  fi
  cmake -S .llamacpp -B /tmp/lb -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF \
      -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    && cmake --build /tmp/lb -j "$jobs" --target "$@"
}
# `make_model PRESET DTYPE FILE [SECONDS]`: make-model on the GPU into a .part.gguf beside FILE (its log FILE.log),
# renamed to FILE when whole; nothing when FILE exists; SECONDS: a time limit.
make_model() {
  [ -f "$3" ] && return 0
  ${4:+timeout "$4"} python3 -m stagewise make-model --config "$1" --dtype "$2" --seed 0 --device cuda \
    "${3%.gguf}.part.gguf" > "$3.log" 2>&1 && mv "${3%.gguf}.part.gguf" "$3"
}
