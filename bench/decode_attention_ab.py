"""Decode attention A/B on a GPU: the kernel split by each row's own length (this tree) against an earlier
kernel file (the bucket-sliced one: its keys cut by the step's attended-length bucket), per layer.

    PYTHONPATH=. python3 bench/decode_attention_ab.py --old .ab_old/stagewise/kernels/decode_attention_triton.py \
        --out bench/results/warm_up_h200/decode_attention_ab.json

Each case is one layer's decode attention of ``batch`` rows at ``length`` keys (every row, or one row that
long beside rows of 200 keys: ``mixed``), a Llama-3-8B layer (32 query heads, 8 KV heads, head_dim 128) and
a Qwen3.6 layer (16, 2, 256, with the output gate), bf16 KV in 64-position blocks; 32 layers' worth of
caches per case, so that every call reads HBM. The old kernel gets the attended length a CUDA graph gave it
(``kv_bucket`` of the longest row). Times are µs per call, replayed from one CUDA graph
(``bench/kernel_timing.graph_us``); a table is printed, JSON (command, machine, date, rows) written.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import torch

from bench.kernel_timing import graph_us
from stagewise.kernels.decode_attention_triton import decode_attention
from stagewise.runtime.step_graphs import kv_bucket

LAYERS = 32  # cache copies a graph cycles through (more bytes than the L2 holds)
BLOCK_TOKENS = 64
SHAPES = {"llama8b": (32, 8, 128, False), "qwen36": (16, 2, 256, True)}  # heads, kv heads, head_dim, gate
CASES = [(1, 256), (1, 2048), (1, 32768), (1, 131072), (8, 2048), (8, 32768), (64, 256), (64, 2048),
         (64, 16384)]  # (rows, keys)
SHORT_KEYS = 200  # the other rows of a mixed batch


def _old_kernel(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_decode_attention_triton", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _case(old: ModuleType, shape: str, batch: int, length: int, mixed: bool) -> dict[str, object]:
    heads, kv_heads, dim, gated = SHAPES[shape]
    lengths = [length] + [SHORT_KEYS if mixed else length] * (batch - 1)
    per_row = -(-length // BLOCK_TOKENS)
    blocks = batch * per_row + 1
    layers = max(1, min(LAYERS, (8 << 30) // (2 * blocks * kv_heads * BLOCK_TOKENS * dim * 2)))  # <= 8 GiB
    dev = torch.device("cuda")
    caches = [(torch.randn(blocks, kv_heads, BLOCK_TOKENS, dim, device=dev, dtype=torch.bfloat16),
               torch.randn(blocks, kv_heads, BLOCK_TOKENS, dim, device=dev, dtype=torch.bfloat16))
              for _ in range(layers)]
    table = torch.arange(batch * per_row, device=dev, dtype=torch.int32).view(batch, per_row)
    positions = torch.tensor(lengths, device=dev)[:, None] - 1  # (B, 1)
    q = torch.randn(batch, 1, heads, dim, device=dev, dtype=torch.bfloat16)
    gate = torch.randn(batch, 1, heads, dim, device=dev, dtype=torch.bfloat16) if gated else None
    bucket = kv_bucket(length, 1 << 20)

    def new(i: int) -> torch.Tensor:
        k, v = caches[i % layers]
        return decode_attention(q, k, v, table, positions, gate)

    def before(i: int) -> torch.Tensor:
        k, v = caches[i % layers]
        return old.decode_attention(q, k, v, table, positions, bucket, gate)

    diff = (new(0).float() - before(0).float()).abs().max().item()
    old_us, new_us = graph_us(before, LAYERS), graph_us(new, LAYERS)
    return {"shape": shape, "rows": batch, "keys": length, "mixed": mixed, "old_us": old_us, "new_us": new_us,
            "new_over_old": new_us / old_us, "max_abs_diff": diff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the earlier decode_attention_triton.py (takes kv_length)")
    ap.add_argument("--out", default="bench/results/warm_up_h200/decode_attention_ab.json")
    args = ap.parse_args()
    old = _old_kernel(args.old)
    rows = []
    print(f"{'shape':<8} {'rows':>4} {'keys':>7} {'mixed':>5} {'old µs':>8} {'new µs':>8} {'new/old':>8} {'max |diff|':>10}")
    for shape in SHAPES:
        for batch, length in CASES:
            for mixed in (False, True) if batch > 1 else (False,):
                r = _case(old, shape, batch, length, mixed)
                rows.append(r)
                print(f"{shape:<8} {batch:>4} {length:>7} {mixed!s:>5} {r['old_us']:>8.1f} {r['new_us']:>8.1f} "
                      f"{r['new_over_old']:>8.3f} {r['max_abs_diff']:>10.2e}", flush=True)
                torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "machine": torch.cuda.get_device_name(0),
                                          "date": datetime.now(UTC).isoformat(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
