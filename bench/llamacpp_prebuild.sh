#!/usr/bin/env bash
# Build llama.cpp for sm_90a on this CPU machine (no GPU: nvcc 13 is here, cuBLAS comes from PyPI's wheel, the driver
# library is a link-time stub) into .llamacpp-bin/bin.tar.xz (~43 MB), which device scripts carry instead of building there
# (bench/device_steps.sh's llamacpp_build copies it): about 6.5 device-minutes saved per session that times llama.cpp.
# The targets and CMake flags are llamacpp_build's; the binaries find their libraries beside them ($ORIGIN), and
# cuBLAS and the driver on the GPU machine (steps_setup's LD_LIBRARY_PATH). Takes ~1 hour on 2 cores.
# Usage (repository root, after `../shared/tools/llamacpp-source.sh .llamacpp`): bash bench/llamacpp_prebuild.sh [JOBS]
set -euo pipefail
JOBS=${1:-2}; B=${LLAMACPP_PREBUILD_DIR:-/tmp/lbhost}; DEPS=${LLAMACPP_PREBUILD_DEPS:-/tmp/llamacpp_deps}
mkdir -p "$DEPS"
if [ ! -e "$DEPS/cublas/nvidia/cu13/lib/libcublas.so" ]; then  # headers and libraries of cuBLAS 13
  python3 -m pip download -q --no-deps "nvidia-cublas==13.*" -d "$DEPS/wheel"
  python3 -m zipfile -e "$DEPS"/wheel/nvidia_cublas-*.whl "$DEPS/cublas"
  ln -sf libcublas.so.13 "$DEPS/cublas/nvidia/cu13/lib/libcublas.so"
  ln -sf libcublasLt.so.13 "$DEPS/cublas/nvidia/cu13/lib/libcublasLt.so"
fi
# The driver library for the linker (libcuda.so.1 by name; the GPU machine's driver resolves the symbols): a stub
# defining the driver functions that ggml-cuda calls, read from the library once it is built.
stub() {
  mkdir -p "$DEPS/stub"
  { echo 'int stagewise_link_stub(void) { return 0; }'
    for f in "$@"; do echo "int $f(void) { return 0; }"; done; } > "$DEPS/stub/stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$DEPS/stub/libcuda.so" "$DEPS/stub/stub.c"
  ln -sf libcuda.so "$DEPS/stub/libcuda.so.1"  # the name the executables' links look for (-rpath-link)
}
[ -e "$DEPS/stub/libcuda.so" ] || stub
I=$DEPS/cublas/nvidia/cu13/include; L=$DEPS/cublas/nvidia/cu13/lib
cmake -S .llamacpp -B "$B" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=OFF \
    -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DCUDA_cublas_LIBRARY="$L/libcublas.so" -DCUDA_cublasLt_LIBRARY="$L/libcublasLt.so" \
    -DCUDA_cuda_driver_LIBRARY="$DEPS/stub/libcuda.so" -DCMAKE_CUDA_FLAGS="-I$I" -DCMAKE_CXX_FLAGS="-I$I" \
    -DCMAKE_C_FLAGS="-I$I" -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$DEPS/stub" -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DCMAKE_BUILD_RPATH='$ORIGIN' > "$B.configure.log"
cmake --build "$B" -j "$JOBS" --target ggml-cuda
stub $(nm -D --undefined-only "$B"/bin/libggml-cuda.so | awk '$2 ~ /^cu[A-Z]/ {print $2}' | sort -u)
cmake --build "$B" -j "$JOBS" --target llama-server llama-bench llama-batched-bench llama-quantize
# one xz archive (the CUDA library is 60 MB; the working tree that travels is limited to 64 MiB, .wheels included)
rm -rf "$B.out" && mkdir -p "$B.out"
cp -a "$B"/bin/llama-server "$B"/bin/llama-bench "$B"/bin/llama-batched-bench "$B"/bin/llama-quantize "$B.out"/
cp -a "$B"/bin/*.so* "$B.out"/
strip --strip-unneeded "$B.out"/* 2>/dev/null || true
mkdir -p .llamacpp-bin && tar cJf .llamacpp-bin/bin.tar.xz -C "$B.out" .
du -sh .llamacpp-bin/bin.tar.xz
