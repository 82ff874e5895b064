"""Probe: a small Qwen3.6-geometry Q8_0 GGUF made on the GPU and on the CPU, loaded on a GPU and on
the CPU: are prefill and decode logits finite in every combination?

    python bench/gguf_gpu_probe.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model

CONFIG = "bench/q36mini_config.json"  # the Qwen3.6-35B-A3B geometry with 4 blocks and a 4096 vocabulary


def trace(path: str, devices: str) -> None:
    loaded = load_model(path, devices=devices, placement="single", context=600, dtype="bfloat16", cuda_graphs=False)
    pipe = loaded.pipeline
    pipe.reset(0)
    out = pipe.step(torch.arange(1, 513)[None] % 4000, torch.arange(512)[None], start=0)
    finite = [bool(torch.isfinite(out.logits).all())]
    for i in range(2):
        out = pipe.step(torch.tensor([[5]]), torch.tensor([[512 + i]]), start=512 + i)
        finite.append(bool(torch.isfinite(out.logits).all()))
    print(path, devices, "finite", finite, flush=True)
    loaded.close()


def main() -> int:
    for dev in ("cuda", "cpu"):
        subprocess.run([sys.executable, "-m", "stagewise", "make-model", "--config", CONFIG, "--format", "gguf",
                        "--dtype", "q8_0", "--seed", "0", "--device", dev, f"/tmp/mini_{dev}.gguf"], check=True)
    trace("/tmp/mini_cuda.gguf", "cuda:0")
    trace("/tmp/mini_cpu.gguf", "cuda:0")
    trace("/tmp/mini_cuda.gguf", "cpu:1x40GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
