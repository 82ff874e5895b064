#!/usr/bin/env bash
# The wheels the GPU machine lacks (its Python 3.12 has torch, triton and transformers), downloaded on this machine into
# .wheels (git-ignored; device calls carry it and install it with `pip install --no-index --no-deps --target /tmp/site`):
# what the runtime imports and what its GPU tests import (`pytest -m gpu tests` collects the Anthropic and Ollama API
# tests too). numpy is left out: the GPU machine's torch comes with its own.
# Usage (repository root): bash bench/device_wheels.sh
set -euo pipefail
python3 -m pip download -q --only-binary :all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d .wheels \
  gguf fastapi opentelemetry-api starlette uvicorn pydantic pydantic-core annotated-types typing-inspection llguidance \
  openai jiter distro sniffio msgspec pyzmq anthropic ollama httpx hypothesis
rm -f .wheels/numpy-*.whl
du -sh .wheels
