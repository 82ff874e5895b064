#!/usr/bin/env bash
# Create .venv at the repository root with stagewise and its test extras.
# Keeps a CUDA torch that the machine already has (the venv sees system packages then);
# otherwise installs the CPU build torch==2.13.0, which pip takes from this machine's disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    echo "setup: keeping the system's CUDA torch"
    "$PYTHON" -m venv --system-site-packages .venv
  else
    "$PYTHON" -m venv .venv
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (CPU build)"
  .venv/bin/python -m pip install -q torch==2.13.0
fi
.venv/bin/python -m pip install -q -e '.[test]'
touch .venv/.installed
