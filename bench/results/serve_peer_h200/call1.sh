#!/usr/bin/env bash
# Call 1 of 3 (one H200; about 8 min, estimated): llama-server and llama-quantize built into build/lb (kept on the
# warm machine for calls 2 and 3) while make-model writes Llama-3.1-8B F16 (random weights); llama-quantize makes
# it Q4_K_M (llama.cpp's own bytes) in /tmp/w. Needs .llamacpp (../shared/tools/llamacpp-source.sh .llamacpp)
# and .wheels carried to the device machine.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=build/lb; W=/tmp/w; mkdir -p $W
if [ ! -x $B/bin/llama-server ] || [ ! -x $B/bin/llama-quantize ]; then
  ( cmake -S .llamacpp -B $B -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /tmp/cmake.log 2>&1 \
    && cmake --build $B -j 15 --target llama-server llama-quantize > /tmp/build.log 2>&1; echo "[build rc $?]" ) &
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site
F=$W/llama-3.1-8b-Q4_K_M.gguf
if [ ! -f $F ]; then
  stamp "make-model llama-3.1-8b f16"
  timeout 180 python3 -m stagewise make-model --config llama-3.1-8b --dtype f16 --seed 0 --device cuda $W/l8-f16.gguf > /dev/null
fi
stamp "waiting for the build"; wait; tail -2 /tmp/build.log 2>/dev/null; ls $B/bin/llama-server $B/bin/llama-quantize
if [ ! -f $F ]; then
  timeout 150 $B/bin/llama-quantize $W/l8-f16.gguf $F Q4_K_M 16 > /tmp/q.log 2>&1 || tail -3 /tmp/q.log
  rm -f $W/l8-f16.gguf
fi
ls -l $F; stamp done
