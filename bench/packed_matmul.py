"""Packed matmul for many rows (prefill, batched decode) at Llama-3.1-8B's shapes: the fused Triton GEMM
(tiles dequantized in registers feeding ``tl.dot``) beside bounded dequantized tiles + cuBLAS
(``tiled_linear`` with the Triton ``dequantize_rows``), and the dense bf16 matmul, at 16-2,048 rows.

Times are CUDA-event medians of repeated calls (ms-scale work: launch gaps are noise); outputs are
checked against float64 of the dequantized weight. GPU only.

    python3 bench/packed_matmul.py --out bench/results/packed_matmul_h200.json [--types q4_k,q6_k]
    python3 bench/packed_matmul.py --sweep-fused --out bench/results/packed_gemm_tiles_h200.json

``--sweep-fused`` times the fused GEMM's tile candidates (``block_m`` and :class:`GemmTiles`) at
16-64 rows (batched decode) instead.
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

from bench.kernel_timing import eager_ms
from bench.packed_gemv import _random_weight
from stagewise.kernels.expert_stacks import PackedTensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.moe_grouped_triton import TILES_PACKED, GemmTiles, grouped_gemm
from stagewise.kernels.packed_dequant_triton import dequantize_rows
from stagewise.kernels.packed_gemm import packed_gemm
from stagewise.weights.quant.tiled_linear import tiled_linear

T = GGMLQuantizationType
SHAPES = {"qkv 6144x4096": (6144, 4096), "gate/up 28672x4096": (28672, 4096), "down 4096x14336": (4096, 14336)}
ROWS = (16, 64, 128, 256, 512, 2048)
TILES = (1 << 22, 1 << 24)


def _ms(fn: Callable[[], torch.Tensor]) -> float:
    return eager_ms(fn, warmup=1, iters=7)


FUSED = [(64, TILES_PACKED), (16, GemmTiles(64, 256, 4, 2)), (16, GemmTiles(128, 256, 4, 2)),
         (32, GemmTiles(64, 256, 4, 2)), (32, GemmTiles(128, 256, 8, 2)), (64, GemmTiles(128, 256, 8, 2)),
         (16, GemmTiles(32, 256, 2, 3)), (32, GemmTiles(64, 256, 4, 3)), (16, GemmTiles(64, 256, 4, 3)),
         (64, GemmTiles(32, 256, 4, 2))]


def _sweep_fused(dev: torch.device, types: list[GGMLQuantizationType]) -> list[dict[str, object]]:
    rows_out: list[dict[str, object]] = []
    for label, (n, k) in SHAPES.items():
        for qtype in types:
            w = _random_weight(qtype, n, k, dev)
            w64 = dequantize_rows(w.qs, w.qh, w.meta, qtype, k).double()
            stack = PackedTensors(w.qs[None], w.qh[None], w.meta[None], qtype, k)
            for m in (16, 32, 64):
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                ref = x.double() @ w64.T
                res: dict[str, object] = {"shape": label, "type": qtype.name, "rows": m}
                for block_m, tiles in FUSED:
                    name = f"m{block_m} n{tiles.block_n} k{tiles.block_k} w{tiles.num_warps} s{tiles.num_stages}"
                    align = identity_alignment(m, block_m, dev)

                    def fn(x: torch.Tensor = x, stack: PackedTensors = stack, align: object = align,
                           tiles: GemmTiles = tiles) -> torch.Tensor:
                        return grouped_gemm(x, stack, align, 1, tiles, gather_rows=False)  # type: ignore[arg-type]
                    try:
                        err = float((fn().double() - ref).norm() / ref.norm())
                        res[name] = {"ms": _ms(fn), "rel_err": err}
                    except Exception as exc:  # a config the compiler refuses is reported, not fatal
                        res[name] = {"error": f"{type(exc).__name__}: {str(exc)[:100]}"}
                rows_out.append(res)
                timed = sorted((v["ms"], name) for name, v in res.items() if isinstance(v, dict) and "ms" in v)
                print(f"{qtype.name:5s} {label:20s} rows {m:3d}  " + "  ".join(f"{nm} {t:.3f}" for t, nm in timed[:4]),
                      f" | current {res.get('m64 n64 k256 w8 s2')}", flush=True)
    return rows_out


def _compare(dev: torch.device, types: list[GGMLQuantizationType]) -> list[dict[str, object]]:
    """The fused GEMM beside dequantized tiles + cuBLAS and the dense matmul, every shape, type and row count."""
    rows_out: list[dict[str, object]] = []
    for label, (n, k) in SHAPES.items():
        dense = (torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16)
        for qtype in types:
            w = _random_weight(qtype, n, k, dev)
            w64 = dequantize_rows(w.qs, w.qh, w.meta, qtype, k).double()
            for m in ROWS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                ref = x.double() @ w64.T
                fns: dict[str, Callable[[], torch.Tensor]] = {
                    "fused": lambda x=x, w=w: packed_gemm(x, w)}
                for tile in TILES:
                    fns[f"tiles {tile >> 20}M"] = (lambda x=x, w=w, qtype=qtype, k=k, n=n, tile=tile: tiled_linear(
                        x, n, k, lambda lo, hi, dtype: dequantize_rows(w.qs[lo:hi], w.qh[lo:hi], w.meta[lo:hi], qtype, k,
                                                                       dtype), tile))
                res: dict[str, object] = {"shape": label, "type": qtype.name, "rows": m,
                                          "dense_bf16_ms": _ms(lambda x=x, dense=dense: torch.nn.functional.linear(x, dense))}
                for name, fn in fns.items():
                    err = float((fn().double() - ref).norm() / ref.norm())
                    res[name] = {"ms": _ms(fn), "rel_err": err}
                rows_out.append(res)
                print(f"{qtype.name:5s} {label:20s} rows {m:5d}  dense {res['dense_bf16_ms']:.3f} ms  " + "  ".join(
                    f"{name} {res[name]['ms']:.3f}" for name in fns), flush=True)  # type: ignore[index]
    return rows_out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/packed_matmul_h200.json")
    ap.add_argument("--types", default="q4_k,q6_k")
    ap.add_argument("--sweep-fused", action="store_true", help="time the fused GEMM's tiles at 16-64 rows")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/packed_matmul.py needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    types = [T[t.strip().upper()] for t in args.types.split(",") if t.strip()]
    rows_out = _sweep_fused(dev, types) if args.sweep_fused else _compare(dev, types)
    report = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
              "date": datetime.datetime.now(datetime.UTC).isoformat(), "rows": rows_out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
