"""Packed matmul for many rows (batched decode, prefill) at Llama-3.1-8B's shapes: kernel B beside bounded
dequantized tiles + cuBLAS (``tiled_linear`` with the Triton ``dequantize_rows``, the path from 129 rows)
and the dense bf16 matmul, at 16-2,048 rows: where kernel B stops winning.

Kernel B runs in 128-row blocks past 128 rows (each weight value converted once per block). Times are
CUDA-event medians of repeated calls (ms-scale work: launch gaps are noise); outputs are checked against
float64 of the dequantized weight. GPU only.

    python3 bench/packed_matmul.py --out bench/results/kquant_h200/packed_matmul.json [--types q4_k,q6_k]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from gguf.constants import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import eager_ms, rel_err
from bench.packed_gemv import _random_weight
from stagewise.kernels.expert_stacks import PackedTensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.packed_decode_triton import PackedTiles, packed_decode_gemm
from stagewise.kernels.packed_dequant_triton import dequantize_rows
from stagewise.kernels.packed_matmul import B_MAX_ROWS, dense_tiles, step_blocks
from stagewise.weights.quant.tiled_linear import tiled_linear

T = GGMLQuantizationType
SHAPES = {"qkv 6144x4096": (6144, 4096), "gate/up 28672x4096": (28672, 4096), "down 4096x14336": (4096, 14336)}
ROWS = (16, 32, 64, 128, 256, 512, 2048)
TILES = (1 << 24,)  # the device tile of PackedWeight (DEVICE_TILE_ELEMENTS)


def _kernel_b(x: torch.Tensor, w: PackedTensors) -> torch.Tensor:
    """Kernel B at the dispatch's tiles up to 128 rows; beyond, 128-row blocks with the same tiles."""
    rows, k = x.shape
    n = w.qs.shape[0]
    if rows <= B_MAX_ROWS:
        block_m, tiles = dense_tiles(rows, n, k, w.ggml_type, x.device)
    else:
        block_m, tiles = 128, PackedTiles(64, 4, 2, False, step_blocks(w.ggml_type, k))
    stack = PackedTensors(w.qs[None], w.qh[None], w.meta[None], w.ggml_type, k)
    return packed_decode_gemm(x, stack, identity_alignment(rows, block_m, x.device), 1, tiles, gather_rows=False)


def _compare(dev: torch.device, types: list[GGMLQuantizationType]) -> list[dict[str, object]]:
    rows_out: list[dict[str, object]] = []
    for label, (n, k) in SHAPES.items():
        dense = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        for qtype in types:
            w = _random_weight(qtype, n, k, dev)
            w64 = dequantize_rows(w.qs, w.qh, w.meta, qtype, k).double()
            for m in ROWS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                ref = x.double() @ w64.T
                fns: dict[str, Callable[[], torch.Tensor]] = {"kernel B": lambda x=x, w=w: _kernel_b(x, w)}
                for tile in TILES:
                    fns[f"tiles {tile >> 20}M"] = (lambda x=x, w=w, qtype=qtype, k=k, n=n, tile=tile: tiled_linear(
                        x, n, k, lambda lo, hi, dtype: dequantize_rows(w.qs[lo:hi], w.qh[lo:hi], w.meta[lo:hi], qtype, k,
                                                                       dtype), tile))
                res: dict[str, object] = {"shape": label, "type": qtype.name, "rows": m,
                                          "dense_bf16_ms": eager_ms(lambda x=x, d=dense: torch.nn.functional.linear(x, d))}
                for name, fn in fns.items():
                    res[name] = {"ms": eager_ms(fn, warmup=1, iters=7), "rel_err": rel_err(fn(), ref)}
                rows_out.append(res)
                print(f"{qtype.name:5s} {label:20s} rows {m:5d}  dense {res['dense_bf16_ms']:.3f} ms  " + "  ".join(
                    f"{name} {res[name]['ms']:.3f}" for name in fns), flush=True)  # type: ignore[index]
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/kquant_h200/packed_matmul.json")
    ap.add_argument("--types", default="q4_k,q6_k")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/packed_matmul.py needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    types = [T[name.strip().upper()] for name in args.types.split(",") if name.strip()]
    with torch.inference_mode():
        rows_out = _compare(dev, types)
    report = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
              "date": datetime.datetime.now(datetime.UTC).isoformat(), "rows": rows_out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
