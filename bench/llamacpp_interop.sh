#!/usr/bin/env bash
# Does llama.cpp load what `make-model` writes? For every preset: a GGUF with the preset's own
# vocabulary and layer kinds but a tiny width (tiny presets as they are), loaded and run for a few
# tokens with llama.cpp's `llama-simple` (which loads every tensor, checks every shape, builds the
# tokenizer and decodes). Pass/fail per model goes to bench/results/llamacpp_interop.json.
#
# Usage: bench/llamacpp_interop.sh [LLAMA_BUILD_DIR]
#   LLAMA_BUILD_DIR: a llama.cpp CMake build dir holding bin/llama-simple. Without it, llama.cpp
#   is built (CPU only, llama-simple only) from the llama-cpp-python sdist's vendored copy in
#   $WORK (default /tmp/llamacpp-interop); nothing is written into the repository but the result.
# Env: PYTHON (default .venv/bin/python), JOBS (default 2), WORK, LLAMA_CPP_VERSION (recorded with a build dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
JOBS=${JOBS:-2}
WORK=${WORK:-/tmp/llamacpp-interop}
BUILD=${1:-}
mkdir -p "$WORK"

if [[ -z "$BUILD" ]]; then
  "$PYTHON" -m pip download --no-deps --no-binary :all: llama-cpp-python -d "$WORK/sdist" >/dev/null
  SDIST=$(ls "$WORK"/sdist/llama_cpp_python-*.tar.gz | head -1)
  tar xzf "$SDIST" -C "$WORK"
  SRC=$(ls -d "$WORK"/llama_cpp_python-*/vendor/llama.cpp | head -1)
  BUILD="$WORK/build"
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF >/dev/null
  cmake --build "$BUILD" --target llama-simple -j"$JOBS" >/dev/null
  LLAMA_VERSION="llama-cpp-python sdist $(basename "$SDIST" .tar.gz)"
else
  LLAMA_VERSION="${LLAMA_CPP_VERSION:-build dir $BUILD}"
fi
SIMPLE="$BUILD/bin/llama-simple"
[[ -x "$SIMPLE" ]] || { echo "no llama-simple in $BUILD/bin" >&2; exit 2; }

PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$SIMPLE" "$WORK/models" "$LLAMA_VERSION" "$*" <<'PY'
import datetime, json, platform, subprocess, sys
from pathlib import Path

from stagewise.weights.make_model import load_hf_config, make_model, preset_names

simple, out_dir, version, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
out_dir.mkdir(parents=True, exist_ok=True)
SHRINK = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "num_hidden_layers": 4, "moe_intermediate_size": 32, "num_experts": 8,
          "num_experts_per_tok": 2, "shared_expert_intermediate_size": 32, "linear_num_key_heads": 2,
          "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
          "full_attention_interval": 2}
rows = []
for preset in preset_names():
    raw = load_hf_config(preset)
    if not preset.startswith(("tiny-", "demo")):  # real vocabulary and layer kinds, tiny width
        raw |= {k: v for k, v in SHRINK.items() if k in raw or k in ("head_dim",)}
        raw.pop("layer_types", None)
    path = out_dir / f"{preset}.gguf"
    for dtype in ("f16", "q8_0", "q4_0"):
        try:
            make_model(raw, path, "gguf", dtype, seed=1)
        except Exception as exc:  # a preset make-model cannot write is a result, not a crash
            rows.append({"preset": preset, "dtype": dtype, "passed": False, "stage": "make-model", "error": str(exc)})
            continue
        proc = subprocess.run([simple, "-m", str(path), "-n", "4", "Hello"], capture_output=True, text=True, errors="replace", timeout=300)
        tail = [l for l in (proc.stderr + proc.stdout).splitlines() if "error" in l.lower() or "failed" in l.lower()]
        rows.append({"preset": preset, "dtype": dtype, "vocab_size": raw.get("vocab_size"), "passed": proc.returncode == 0,
                     "returncode": proc.returncode, "errors": tail[-5:]})
        print(f"{preset:22s} {dtype:5s} {'PASS' if proc.returncode == 0 else 'FAIL'} {' | '.join(tail[-2:])}")
result = {"command": f"bench/llamacpp_interop.sh {args}".strip(), "llama_cpp": version, "machine": platform.node(),
          "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "results": rows,
          "passed": sum(r["passed"] for r in rows), "total": len(rows)}
Path("bench/results/llamacpp_interop.json").write_text(json.dumps(result, indent=2) + "\n")
print(f"{result['passed']}/{result['total']} loaded; wrote bench/results/llamacpp_interop.json")
PY
