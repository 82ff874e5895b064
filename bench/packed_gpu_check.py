"""GPU check of a packed GGUF file: logits of the Triton path on cuda against the torch path on CPU
(float32), for a prefill and the decode steps after it; prints the max relative difference.

    python bench/packed_gpu_check.py FILE.gguf [--tokens 40]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.models.registry import build_stage
from stagewise.weights.gguf_source import GGUFSource
from stagewise.weights.stage_loader import load_stage


def _logits(path: str, device: torch.device, prompt: torch.Tensor) -> torch.Tensor:
    source = GGUFSource(path)
    c = source.config
    stage = build_stage(c, 0, c.num_layers, entry=True, exit=True)
    load_stage(stage, source, device, torch.float32)
    states = stage.new_states(1, 128, torch.float32, device)
    with torch.no_grad():
        out = stage(prompt.to(device), torch.arange(prompt.shape[1], device=device)[None], states, start=0,
                    all_logits=True)
    return out.logits.float().cpu()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=40)
    args = p.parse_args()
    vocab = GGUFSource(args.model).config.vocab_size
    for tokens in (3, args.tokens):  # the gathered (decode-sized) and the grouped (prefill) paths
        prompt = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(0))
        ref = _logits(args.model, torch.device("cpu"), prompt)
        got = _logits(args.model, torch.device("cuda"), prompt)
        rel = float((got - ref).norm() / ref.norm())
        print(f"{Path(args.model).name} tokens={tokens} rel_err={rel:.3e} nan={bool(torch.isnan(got).any())}")


if __name__ == "__main__":
    main()
