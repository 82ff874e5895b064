"""Packed GEMV (every GGUF block type) at Llama-3.1-8B's shapes, inside CUDA graphs, beside the dense bf16 GEMV.

Each candidate is captured as a graph of calls over rotating weight copies (more bytes than the L2
holds, so every call reads HBM) and the replay is timed with CUDA events (``kernel_timing.graph_us``):
µs per call and GB/s of the weight's bytes, one token. Every output is checked against float64 of
the weight as ``dequantize_rows`` expands it (itself bit-identical to gguf.quants, tests/test_packed_kernels.py).
The weights are random block bytes with small finite scales. GPU only.

    python3 bench/packed_gemv.py --out bench/results/packed_gemv_h200.json [--types q4_k,q6_k] [--words]
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

from bench.kernel_timing import graph_us, rel_err
from stagewise.kernels import word_gemv_triton
from stagewise.kernels.expert_stacks import PackedTensors
from stagewise.kernels.gemv_triton import config_for as dense_config_for
from stagewise.kernels.gemv_triton import gemv
from stagewise.kernels.packed_dequant_triton import dequantize_rows
from stagewise.kernels.packed_gemv_triton import SLOT_TYPES, config_for, packed_gemv
from stagewise.kernels.word_gemv_triton import words_config
from stagewise.spec.packed_types import PACKED, block_bytes, block_elements, row_bytes
from stagewise.weights.quant.packed_planes import split_planes

T = GGMLQuantizationType
SHAPES = {"qkv-like 4096x4096": (4096, 4096), "gate/up 14336x4096": (14336, 4096),
          "down 4096x14336": (4096, 14336), "head 128256x4096": (128256, 4096)}
F16_AT = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108],
          T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}
CANDIDATES = [(1, 2048, 4, 3), (2, 1024, 4, 4), (4, 512, 2, 3), (2, 1024, 2, 3), (2, 2048, 4, 3), (4, 1024, 2, 3),
              (4, 1024, 4, 3), (1, 1024, 2, 3), (1, 4096, 4, 2), (8, 512, 2, 3), (2, 512, 2, 4), (4, 2048, 4, 2),
              (8, 1024, 4, 2)]
WORD_CANDIDATES = [(4, 4096, 2), (8, 4096, 2), (2, 4096, 2), (4, 2048, 1), (8, 2048, 1), (2, 2048, 1)]
ROTATE_BYTES = 512 << 20  # weights touched per graph: well past the 60 MB L2


def _random_raw(qtype: GGMLQuantizationType, n: int, k: int, dev: torch.device) -> torch.Tensor:
    """Random block bytes ``(n, row_bytes)`` on ``dev`` with finite f16 scales (and moderate MXFP4 exponents)."""
    blocks = k // block_elements(qtype)
    raw = torch.randint(0, 256, (n, blocks, block_bytes(qtype)), dtype=torch.uint8, device=dev)
    for at in F16_AT[qtype]:
        scale = (torch.rand(n, blocks, 1, device=dev) * 1e-3).to(torch.float16)
        raw[..., at : at + 2] = scale.view(torch.uint8)
    if qtype == T.MXFP4:
        raw[..., 0] = torch.randint(118, 126, (n, blocks), dtype=torch.uint8, device=dev)
    return raw.reshape(n, row_bytes(qtype, k))


def _random_weight(qtype: GGMLQuantizationType, n: int, k: int, dev: torch.device) -> PackedTensors:
    """:func:`_random_raw` as the resident planes."""
    return PackedTensors(*split_planes(_random_raw(qtype, n, k, dev), qtype), qtype, k)


def _sweep(label: str, nbytes: int, fns: dict[str, Callable[[int], torch.Tensor]], ref: torch.Tensor,
           copies: int, current: str, dense_us: float) -> dict[str, object]:
    cands: dict[str, dict[str, float] | dict[str, str]] = {}
    for name, fn in fns.items():
        try:
            err = rel_err(fn(0), ref)
            us = graph_us(fn, copies)
        except Exception as exc:  # a config the compiler refuses is reported, not fatal
            cands[name] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
            continue
        cands[name] = {"us": us, "GBps": nbytes / us / 1e3, "rel_err": err}
    ok = {k: v for k, v in cands.items() if isinstance(v.get("us"), float) and float(v["rel_err"]) < 1e-2}
    best = min(ok, key=lambda k: float(ok[k]["us"])) if ok else "none"
    cur = cands.get(current, {})
    cur_us = float(cur["us"]) if "us" in cur else float("nan")
    best_txt = f"{best:18s} {float(ok[best]['us']):8.2f} us {float(ok[best]['GBps']):6.0f} GB/s" if ok else "none"
    print(f"{label:34s} {nbytes / 1e6:7.1f} MB  best {best_txt} | current {current:18s} {cur_us:8.2f} us"
          f" | dense bf16 {dense_us:8.2f} us ({dense_us / cur_us:4.2f}x)", flush=True)
    return {"shape": label, "bytes": nbytes, "copies": copies, "current": current, "best": best,
            "dense_bf16_us": dense_us, "candidates": cands}


def _without_word_ptx(call: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``call()`` with the word GEMV's bytes converted by Triton's ops instead of inline PTX."""
    word_gemv_triton.WORDS_ASM = False
    try:
        return call()
    finally:
        word_gemv_triton.WORDS_ASM = True


def _dense_us(x: torch.Tensor, n: int, k: int) -> float:
    """µs per call of the dense bf16 GEMV (ours with dependent launch, or cuBLAS where that is faster)."""
    copies = max(4, min(64, ROTATE_BYTES // (n * k * 2)))
    dense = [(torch.randn(n, k, device=x.device) * 0.02).to(torch.bfloat16) for _ in range(copies)]
    cfg = dense_config_for(n, k, True)
    if cfg is None:
        return graph_us(lambda i: torch.nn.functional.linear(x, dense[i]), copies)
    return graph_us(lambda i: gemv(x, dense[i], config=cfg), copies)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/packed_gemv_h200.json")
    ap.add_argument("--types", default="", help="comma-separated type names (default: every packed type)")
    ap.add_argument("--words", action="store_true",
                    help="the word GEMV's tiles and its PTX off against the former path's config only (a few "
                         "compiles a shape instead of every candidate: minutes a type on a GPU host)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/packed_gemv.py needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    names = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    types = [T[n] for n in names] if names else sorted(PACKED, key=int)
    report: dict[str, object] = {"command": "python3 " + " ".join(sys.argv), "device": torch.cuda.get_device_name(dev),
                                 "date": datetime.datetime.now(datetime.UTC).isoformat(), "rows": []}
    rows: list[dict[str, object]] = []
    for label, (n, k) in SHAPES.items():
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        dense_us = _dense_us(x, n, k)
        print(f"{label}: dense bf16 {n * k * 2 / 1e6:.1f} MB {dense_us:.2f} us {n * k * 2 / dense_us / 1e3:.0f} GB/s")
        for qtype in types:
            nbytes = n * row_bytes(qtype, k)
            copies = max(4, min(64, ROTATE_BYTES // nbytes))
            ws = [_random_weight(qtype, n, k, dev) for _ in range(copies)]
            ref = x.double() @ dequantize_rows(ws[0].qs, ws[0].qh, ws[0].meta, qtype, k).double().T
            former = [config_for(qtype, n, k, False)] if args.words else CANDIDATES
            fns: dict[str, Callable[[int], torch.Tensor]] = {
                str(cfg): (lambda i, x=x, ws=ws, cfg=cfg: packed_gemv(x, ws[i], config=cfg)) for cfg in former}
            words = words_config(qtype, k, False, x.dtype)
            current = f"words {words}" if words else str(config_for(qtype, n, k, False))
            if current not in fns:
                fns[current] = lambda i, x=x, ws=ws: packed_gemv(x, ws[i])
            for cfg in WORD_CANDIDATES if words else ():  # the word GEMV's tiles, then its bytes by Triton's ops
                if k % cfg[1] == 0 and cfg != words:
                    fns[f"words {cfg}"] = lambda i, x=x, ws=ws, cfg=cfg: packed_gemv(x, ws[i], word_config=cfg)
            if words:
                fns["words, no PTX"] = lambda i, x=x, ws=ws: _without_word_ptx(lambda: packed_gemv(x, ws[i]))
            if qtype in SLOT_TYPES and not args.words:  # the byte path beside the slot path, same configs
                for cfg in [*CANDIDATES[:4], config_for(qtype, n, k, False)]:
                    fns[f"bytes {cfg}"] = (lambda i, x=x, ws=ws, cfg=cfg: packed_gemv(x, ws[i], config=cfg, slots=False))
            rows.append(_sweep(f"{qtype.name} {label}", nbytes, fns, ref, copies, current, dense_us))
            del ws
    report["rows"] = rows
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
