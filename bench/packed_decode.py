"""Kernels A and B (packed few-rows GEMM on the planes) on the GPU, inside CUDA graphs, beside what they replace.

Dense matrices at Llama-3.1-8B's shapes, every row count asked: µs per call and GB/s of the packed bytes
for ``new`` (``packed_matmul``: kernel A up to 16 rows, B to 128), ``old`` (the packed GEMV up to 16
rows, one program row per input row, the word GEMV where it applies: what ``PackedWeight.matmul`` takes
for one row of those types; the grouped GEMM with the former ``packed_gemm`` tiles beyond) and ``dense`` (a bf16 matrix of the same shape through ``torch.nn.functional.linear``). With
``--sweep``, kernel A's and kernel B's tiles (:data:`SWEEP_A`, :data:`SWEEP_B`: rows a program, warps, pipeline
stages), kernel B at kernel A's rows and kernel A's inline-PTX conversion on and off. MoE experts at Qwen3.6-35B-A3B's geometry (256 experts, top 8, H 2048, I 512): the whole SwiGLU
experts through ``packed_experts_config``'s blocks (kernel A at decode sizes, kernel B at prefill sizes: 512
tokens by default) against the grouped GEMM. Every output is checked against
float64 of the dequantized weight; the weights are random block bytes with small finite scales,
rotated over copies so that each call reads HBM (``bench/kernel_timing.py``). GPU only.

    PYTHONPATH=. python3 bench/packed_decode.py --out bench/results/kquant_h200/packed_decode.json [--sweep]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from gguf.constants import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stagewise.kernels.packed_decode_triton as packed_decode
from bench.kernel_timing import graph_us, rel_err
from bench.packed_gemv import _random_raw
from stagewise.kernels.expert_stacks import PackedTensors
from stagewise.kernels.moe_align import identity_alignment
from stagewise.kernels.moe_experts import grouped_swiglu_experts, packed_config, packed_experts_config
from stagewise.kernels.moe_grouped_triton import GemmTiles, grouped_gemm
from stagewise.kernels.packed_gemv_triton import packed_gemv
from stagewise.kernels.packed_matmul import BLOCK_N, NUM_STAGES, NUM_WARPS, dense_tiles, packed_matmul
from stagewise.spec.packed_types import row_bytes
from stagewise.weights.quant.packed_weight import PackedWeight

T = GGMLQuantizationType
SHAPES = {"qkv 6144x4096": (6144, 4096), "o 4096x4096": (4096, 4096), "gate/up 28672x4096": (28672, 4096),
          "down 4096x14336": (4096, 14336)}
OLD_FEW = (16, GemmTiles(block_n=128, block_k=256, num_warps=4, num_stages=2))  # the former packed_gemm, <= 32 rows
OLD_MANY = (64, GemmTiles(block_n=32, block_k=256, num_warps=4, num_stages=2))  # 33-127 rows
ROTATE_BYTES = 512 << 20  # weights touched per graph: well past the 60 MB L2
MOE = (256, 8, 2048, 512)  # Qwen3.6-35B-A3B: experts, top-k, hidden, expert intermediate
# --sweep: (weight rows a program, warps, pipeline stages) beside packed_matmul's own (64, 4, 2)
# (block_n, warps, stages); fewer than four warps: Triton takes mma.sync, not wgmma (no per-dot wait, fence or descriptor)
SWEEP_A = ((32, 2, 2), (32, 2, 3), (16, 1, 2), (64, 8, 2), (128, 4, 2), (64, 4, 3))
SWEEP_B = ((32, 2, 3), (32, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 2), (128, 4, 2), (128, 8, 2), (128, 8, 3))


def _weights(qtype: GGMLQuantizationType, n: int, k: int, copies: int, dev: torch.device) -> list[PackedWeight]:
    return [PackedWeight.from_rows(_random_raw(qtype, n, k, dev), qtype, k) for _ in range(copies)]


def _time(fns: dict[str, Callable[[int], torch.Tensor]], ref: torch.Tensor, nbytes: int,
          copies: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, fn in fns.items():
        try:
            err = rel_err(fn(0), ref)
            us = graph_us(fn, copies)
        except Exception as exc:  # a config the compiler refuses is reported, not fatal
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            continue
        out[name] = {"us": round(us, 2), "GBps": round(nbytes / us / 1e3, 1), "rel_err": err}
    return out


def _dense_case(qtype: GGMLQuantizationType, label: str, n: int, k: int, rows_list: list[int], sweep: bool,
                dev: torch.device) -> list[dict[str, Any]]:
    nbytes = n * row_bytes(qtype, k)
    copies = max(2, min(32, ROTATE_BYTES // nbytes))
    ws = _weights(qtype, n, k, copies, dev)
    dense = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(max(2, ROTATE_BYTES // (n * k * 2)))]
    w64 = ws[0].dequantize(torch.float64)
    results = []
    for rows in rows_list:
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ w64.T
        fns: dict[str, Callable[[int], torch.Tensor]] = {"new": lambda i, x=x: packed_matmul(x, ws[i])}
        if rows <= 16:
            fns["old"] = lambda i, x=x: packed_gemv(x, ws[i])
        else:
            block_m, tiles = OLD_FEW if rows <= 32 else OLD_MANY
            align = identity_alignment(rows, block_m, dev)
            fns["old"] = lambda i, x=x, t=tiles, al=align: grouped_gemm(
                x, PackedTensors(ws[i].qs[None], ws[i].qh[None], ws[i].meta[None], qtype, k), al, 1, t,
                gather_rows=False)
        if sweep:  # the kernel the dispatch picks (A or B): rows a program, warps, pipeline stages; the K split as chosen
            block_m, base = dense_tiles(rows, n, k, qtype, dev)

            def tiled(t: packed_decode.PackedTiles, x: torch.Tensor = x, bm: int = block_m) -> Callable[[int], torch.Tensor]:
                return lambda i: packed_decode.packed_decode_gemm(
                    x, PackedTensors(ws[i].qs[None], ws[i].qh[None], ws[i].meta[None], qtype, k),
                    identity_alignment(x.shape[0], bm, dev), 1, t, gather_rows=False)

            for bn, warps, stages in SWEEP_A if rows <= 16 else SWEEP_B:
                fns[f"{'A' if base.scale_after else 'B'} bn{bn} w{warps} s{stages}"] = tiled(
                    dataclasses.replace(base, block_n=bn, num_warps=warps, num_stages=stages))
            if rows <= 16:  # kernel B at kernel A's rows (B_FROM_ONE_ROW's choice) in its default tiles
                fns["B at these rows"] = tiled(dataclasses.replace(
                    base, block_n=BLOCK_N, num_warps=NUM_WARPS, num_stages=NUM_STAGES, scale_after=False))
        timed = _time(fns, ref, nbytes, copies)
        if sweep and rows <= 16:  # kernel A with Triton's conversion
            packed_decode.NIBBLE_ASM = False
            try:
                timed |= {"new no-asm": _time({"x": fns["new"]}, ref, nbytes, copies)["x"]}
            finally:
                packed_decode.NIBBLE_ASM = True
        dense_us = graph_us(lambda i, x=x: torch.nn.functional.linear(x, dense[i % len(dense)]), len(dense))
        row = {"type": qtype.name, "shape": label, "rows": rows, "bytes": nbytes, "dense_bf16_us": round(dense_us, 2),
               **timed}
        results.append(row)
        print(f"{qtype.name:6s} {label:20s} rows {rows:3d}  " + "  ".join(
            f"{name} {v.get('us', 'ERR')} us ({v.get('GBps', '-')} GB/s, err {v.get('rel_err', 0):.1e})"
            for name, v in timed.items()) + f"  | dense bf16 {dense_us:.2f} us", flush=True)
    return results


def _moe_case(qtype: GGMLQuantizationType, tokens: int, dev: torch.device) -> dict[str, Any]:
    experts, top_k, hidden, inter = MOE
    gate_up = PackedWeight.from_rows(_random_raw(qtype, experts * 2 * inter, hidden, dev).reshape(experts, 2 * inter, -1),
                                     qtype, hidden)
    down = PackedWeight.from_rows(_random_raw(qtype, experts * hidden, inter, dev).reshape(experts, hidden, -1), qtype,
                                  inter)
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    top_weight, top_index = torch.topk(torch.softmax(torch.randn(tokens, experts, device=dev), -1), top_k, dim=-1)
    top_weight = top_weight.to(torch.bfloat16)
    configs = {"new (kernel A or B blocks)": packed_experts_config(gate_up, down, tokens * top_k, experts, dev),
               "old (grouped GEMM)": packed_config(dev, gate_up, down, tokens * top_k, experts)}
    runs: dict[str, Callable[[int], torch.Tensor]] = {
        name: lambda _i, cfg=cfg: grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, cfg)
        for name, cfg in configs.items()}
    outs = {name: run(0) for name, run in runs.items()}
    first = next(iter(outs.values()))
    row: dict[str, Any] = {"type": qtype.name, "moe": "qwen3.6-35b-a3b experts", "tokens": tokens,
                           "experts_used": int(torch.unique(top_index).numel())}
    for name, run in runs.items():
        row[name] = {"us": round(graph_us(run, 10), 1), "rel_to_first": rel_err(outs[name], first)}
    print(f"{qtype.name:6s} MoE experts, {tokens} tokens ({row['experts_used']} experts): " + "  ".join(
        f"{name} {row[name]['us']} us" for name in runs), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/kquant_h200/packed_decode.json")
    ap.add_argument("--types", default="q4_k,q6_k,q5_k,iq4_xs")
    ap.add_argument("--shapes", default="", help="comma-separated labels' first words, e.g. gate/up,down (default: all)")
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--moe-tokens", default="8,32,64,512")
    ap.add_argument("--sweep", action="store_true", help="kernels A's and B's tiles; A's PTX conversion (every type)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/packed_decode.py needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    types = [T[t.strip().upper()] for t in args.types.split(",") if t.strip()]
    wanted = {s.strip() for s in args.shapes.split(",") if s.strip()}
    shapes = {label: nk for label, nk in SHAPES.items() if not wanted or label.split()[0] in wanted}
    rows_list = [int(r) for r in args.rows.split(",") if r]  # none: the MoE experts alone
    report: dict[str, Any] = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
                              "date": datetime.datetime.now(datetime.UTC).isoformat(), "dense": [], "moe": []}
    with torch.inference_mode():
        for qtype in types:
            for label, (n, k) in shapes.items() if rows_list else ():
                report["dense"] += _dense_case(qtype, label, n, k, rows_list, args.sweep, dev)
        for qtype in types[:1]:
            for tokens in (int(t) for t in args.moe_tokens.split(",") if t):
                report["moe"].append(_moe_case(qtype, tokens, dev))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
