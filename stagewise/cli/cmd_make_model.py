"""``stagewise make-model``: write a random-weight model (GGUF or safetensors) with a demo tokenizer."""

from __future__ import annotations

import argparse
from typing import Any

from stagewise.weights.make_model import DTYPES, FORMATS, make_model, preset_names


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "make-model",
        help="write a random-weight model of any supported architecture",
        description="Write a random-weight model (deterministic per seed) with a small BPE tokenizer and a "
        f"ChatML template. Presets: {', '.join(preset_names())}.",
    )
    parser.add_argument("out", metavar="OUT", help="output: a .gguf file (GGUF; a name not ending in .gguf is made a folder holding model.gguf), or a directory (safetensors)")
    parser.add_argument("--config", required=True, help="an HF config.json path or a preset name")
    parser.add_argument("--format", dest="fmt", choices=FORMATS, default="gguf")
    parser.add_argument("--dtype", choices=DTYPES, default="f32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu",
                        help="draw and quantize values on this torch device (e.g. cuda: fast for large geometries;"
                             " values then differ from a CPU-made file of the same seed)")
    parser.add_argument("--split-max-bytes", type=int, default=0,
                        help="GGUF split parts / safetensors shards of at most this many bytes")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = make_model(args.config, args.out, fmt=args.fmt, dtype=args.dtype, seed=args.seed, device=args.device,
                      split_max_bytes=args.split_max_bytes)
    print(f"wrote {path}")
    return 0
