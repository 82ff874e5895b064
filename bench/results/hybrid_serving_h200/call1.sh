#!/usr/bin/env bash
# Call 1 of 3 (one H200, ~9 min): issues 44 and 45 on the device. In the background, in their own sessions
# (they outlive this call on the warm machine): llama.cpp's tools built into build/lb and the Qwen3.6-35B-A3B
# Q8_0 file written by make-model into /tmp/w. In the foreground, correctness first: the kernel tests on the
# GPU (packed Gated DeltaNet, prefill attention, every Triton kernel), the whole `-m gpu` suite in one
# process, then the packed DeltaNet kernel benchmark and kernels A and B (CUDA events). Needs .llamacpp and
# .wheels carried.
set -u
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
B=build/lb; W=/tmp/w; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
setsid bash -c "cmake -S .llamacpp -B $B -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF \
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF > /tmp/cmake.log 2>&1 && \
  cmake --build $B -j 12 --target llama-server llama-batched-bench llama-bench llama-quantize > /tmp/build.log 2>&1; \
  echo \$? > /tmp/build.rc" < /dev/null > /dev/null 2>&1 &
setsid bash -c "timeout 480 python3 -m stagewise make-model --config qwen3.6-35b-a3b --dtype q8_0 --seed 0 \
  --device cuda $W/qwen3.6-35b-a3b-Q8_0.gguf > /tmp/make_model.log 2>&1; echo \$? > /tmp/make_model.rc" \
  < /dev/null > /dev/null 2>&1 &
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
stamp "kernel tests on the GPU"
cmd="python3 -m pytest -q -p no:cacheprovider -rfE tests/test_deltanet_packed.py tests/test_triton_kernels.py"
{ echo "\$ $cmd"; timeout 180 $cmd 2>&1; echo "exit status $?"; } > "$O/gpu_kernel_tests_h200.txt"; tail -6 "$O/gpu_kernel_tests_h200.txt"
stamp "the -m gpu suite"
cmd="python3 -m pytest -m gpu tests -p no:cacheprovider -q -rfE"
{ echo "\$ $cmd  # $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  timeout 150 $cmd 2>&1; echo "exit status $?"; } > "$O/gpu_suite_h200.txt"; tail -8 "$O/gpu_suite_h200.txt"
stamp "packed DeltaNet kernels (Qwen3.6 dims)"
timeout 90 python3 bench/deltanet_packed.py --no-sweep --json "$O/deltanet_packed_h200.json" 2>&1 | tail -30
stamp "kernels A and B (bench/packed_decode.py)"
timeout 110 python3 bench/packed_decode.py --out "$O/packed_decode_h200.json" --types q4_k,q6_k --shapes gate/up,down \
  2>&1 | tail -40
stamp "waiting for the build and the file (at most until 540 s)"
while [ ! -f /tmp/build.rc -o ! -f /tmp/make_model.rc ] && [ $(( $(date +%s) - t0 )) -lt 540 ]; do sleep 5; done
echo "build rc $(cat /tmp/build.rc 2>/dev/null || echo running), make-model rc $(cat /tmp/make_model.rc 2>/dev/null || echo running)"
tail -2 /tmp/build.log /tmp/make_model.log 2>/dev/null; ls -l $W $B/bin 2>&1 | tail -8
stamp done
