"""Sweep the few-rows Q8_0 GEMM (``kernels/moe_decode_triton.py``) on the GPU: experts and dense projections.

Cases, at 32 and 64 decoding sequences:
- the Qwen3-30B-A3B / Qwen3.6-35B-A3B expert GEMMs of one MoE layer (gate_up with SiLU·up fused, down),
  routed by a random softmax top-8, against the kernel of commit 6f85180 (``bench/moe_decode_previous.py``,
  then followed by ``silu_mul``) and its tiles;
- the Qwen3-30B-A3B dense Q8_0 projections (fused q/k/v 5120x2048, o 2048x4096, the head 151936x2048)
  against the prefill grouped GEMM's 16-row decode tiles that served them.

Every variant is checked against a float32 block-scaled reference (relative error), run twice
(``torch.equal``: split-K's counter must make it deterministic) and, for gate_up, against
``decode_gemm`` + ``silu_mul`` with the same tiles (``torch.equal``). Times are CUDA-graph replays
(launch cost as in a decode step); bandwidth counts the weight bytes read (routed experts only).
Compiles run first in parallel worker processes (Triton's disk cache), then one process times.

    PYTHONPATH=. python3 bench/q8_0_decode_sweep.py --out bench/results/q8_0_decode_sweep_h200.json --broad
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import functools
import json
import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.moe_decode import _graph_ms
from bench.moe_grouped import _quantize
from stagewise.kernels.moe_align_triton import moe_align_fused
from stagewise.kernels.moe_decode_triton import DecodeTiles, decode_gemm, decode_gemm_glu
from stagewise.kernels.moe_grouped_triton import DECODE_Q8_0, GemmTiles, Q8_0Tensors, grouped_gemm
from stagewise.kernels.q8_0_gemm import _identity_alignment
from stagewise.kernels.silu_mul_triton import silu_mul

EXPERT_MODELS = {"qwen3-30b-a3b": (128, 8, 2048, 768), "qwen3.6-35b-a3b": (256, 8, 2048, 512)}  # E, K, H, I
DENSE = {"qkv": (5120, 2048), "o": (2048, 4096), "head": (151936, 2048)}  # (out, in), Qwen3-30B-A3B
D = DecodeTiles


def expert_variants(broad: bool) -> list[DecodeTiles]:
    """The chosen tiles first; ``broad``: the neighbourhood swept (results in q8_0_decode_sweep_h200.json)."""
    out = [DECODE_Q8_0.gate_up, DECODE_Q8_0.down]
    out += [D(128, 128, 4, st, 1, True, True) for st in (2, 3)] + [D(64, 128, 2, 3, 1, True, True)]
    out += [D(64, k, w, 1, 1, True, True) for k, w in ((128, 2), (256, 2), (64, 2), (128, 1), (128, 4))]  # one stage
    # narrower K steps (less shared memory a program: more programs resident, fewer waves)
    out += [D(n, k, w, st, 1, True, True) for n, k, w, st in ((64, 64, 2, 2), (64, 64, 2, 3), (64, 64, 1, 2), (64, 64, 1, 3),
                                                          (64, 32, 2, 3), (64, 32, 2, 4), (64, 32, 1, 4), (32, 64, 1, 2),
                                                          (32, 64, 1, 3), (32, 128, 1, 2), (64, 64, 4, 2))]
    # K split over 2-4 programs a tile: more, smaller programs (the last wave less empty)
    out += [D(64, 128, 2, 2, split, True, True) for split in (2, 3, 4)]
    out += [D(64, 64, 2, 3, split, True, True) for split in (2, 3)]
    if broad:
        shapes = [(32, 1, 2, False), (32, 2, 2, False), (32, 1, 2, True), (32, 2, 2, True), (32, 2, 3, True),
                  (16, 1, 2, True), (16, 1, 3, True), (64, 2, 2, True), (64, 4, 2, True)]
        out += [D(n, k, w, st, 1, swap, tma) for n, w, st, swap in shapes for k in (128, 256) for tma in (False, True)]
    return list(dict.fromkeys(out))


def dense_variants(broad: bool, deep: bool = False) -> list[tuple[int, DecodeTiles]]:
    """(block_m, tiles): every row in one block (tokens on the dot's narrow side), K split; ``deep``: more
    pipeline stages and wider K steps (more loads in flight a program)."""
    shapes = [(32, 128, 2, 3), (128, 128, 4, 3)]
    if broad:
        shapes += [(16, 32, 1, 3), (32, 32, 1, 3), (64, 32, 2, 4), (64, 128, 2, 3)]
    if deep:
        shapes += [(32, 128, 2, 4), (32, 128, 2, 5), (32, 128, 2, 6), (32, 256, 2, 3), (32, 256, 2, 4),
                   (64, 128, 4, 3), (64, 128, 4, 4), (16, 128, 1, 4), (16, 128, 1, 6), (32, 64, 1, 6)]
    return [(0, D(n, k, w, st, split, True, tma)) for n, k, w, st in shapes for split in (1, 2, 4, 8)
            for tma in (False, True)]


def _reference(a: torch.Tensor, qs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``a @ W.T``, each 32-value block's dot scaled (the kernel's order up to float32 rounding)."""
    parts = torch.einsum("nbj,mbj->mnb", qs.float().unflatten(-1, (-1, 32)), a.float().unflatten(-1, (-1, 32)))
    return (parts * scales.float()[None]).sum(-1)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).norm() / ref.norm())


class Expert:
    def __init__(self, model: str, tokens: int, dev: torch.device) -> None:
        e, k, h, i = EXPERT_MODELS[model]
        torch.manual_seed(0)
        self.gate_up = _quantize(torch.randn(e, 2 * i, h, device=dev) * 0.02)
        self.down = _quantize(torch.randn(e, h, i, device=dev) * 0.02)
        self.x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
        logits = torch.randn(tokens, e, device=dev)
        _, top_index = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
        self.top_index = top_index.to(torch.int32)
        self.k = k
        self.used = int(torch.unique(top_index).numel())
        self.bytes_gate_up = self.used * 2 * i * h * 34 // 32
        self.bytes_down = self.used * h * i * 34 // 32
        self.align = moe_align_fused(self.top_index, e, 16)
        slot_expert = self.top_index.reshape(-1).long()
        gu = _reference(self.x, self.gate_up.qs.flatten(0, 1), self.gate_up.scales.flatten(0, 1))  # (N, E*2I)
        gu = gu.view(tokens, e, 2 * i)[torch.arange(tokens, device=dev).repeat_interleave(k), slot_expert]  # (S, 2I)
        self.ref_h = gu
        g, u = gu.to(torch.bfloat16).float().chunk(2, dim=-1)
        self.act = (g * torch.sigmoid(g) * u).to(torch.bfloat16)  # (S, I)
        self.ref_act = g * torch.sigmoid(g) * u
        d = torch.einsum("snbj,sbj->snb", self.down.qs[slot_expert].float().unflatten(-1, (-1, 32)),
                         self.act.float().unflatten(-1, (-1, 32)))
        self.ref_down = (d * self.down.scales[slot_expert].float()).sum(-1)  # (S, H)

    def run(self, kind: str, tiles: Any) -> Callable[[], torch.Tensor]:
        if kind == "gate_up_plain":
            return lambda: silu_mul(decode_gemm(self.x, self.gate_up, self.align, self.k, tiles, gather_rows=True))
        if kind == "gate_up":
            return functools.partial(decode_gemm_glu, self.x, self.gate_up, self.align, self.k, tiles, gather_rows=True)
        if kind == "gate_up_previous":
            from bench.moe_decode_previous import decode_gemm as previous

            return lambda: silu_mul(previous(self.x, self.gate_up, self.align, self.k, tiles, gather_rows=True))
        if kind == "down":
            return functools.partial(decode_gemm, self.act, self.down, self.align, self.k, tiles, gather_rows=False)
        from bench.moe_decode_previous import decode_gemm as previous

        return functools.partial(previous, self.act, self.down, self.align, self.k, tiles, gather_rows=False)


class Dense:
    def __init__(self, name: str, rows: int, dev: torch.device) -> None:
        n, k = DENSE[name]
        torch.manual_seed(1)
        w = _quantize(torch.randn(1, n, k, device=dev) * 0.02)
        self.qs, self.scales = w.qs, w.scales
        self.x = torch.randn(rows, k, device=dev).to(torch.bfloat16)
        self.rows = rows
        self.bytes = n * k * 34 // 32
        self.ref = _reference(self.x, self.qs[0], self.scales[0])

    def run(self, block_m: int, tiles: Any) -> Callable[[], torch.Tensor]:
        align = _identity_alignment(self.rows, block_m, self.x.device)
        weight = Q8_0Tensors(self.qs, self.scales)
        if isinstance(tiles, GemmTiles):  # the path that served 17-64 rows before
            return functools.partial(grouped_gemm, self.x, weight, align, 1, tiles, gather_rows=False)
        return functools.partial(decode_gemm, self.x, weight, align, 1, tiles, gather_rows=False)


def _jobs(args: argparse.Namespace) -> list[tuple[str, Any, Any]]:
    """Every (case, variant) to time: ("expert", (model, tokens, kind), tiles) or ("dense", (name, rows), (bm, tiles))."""
    jobs: list[tuple[str, Any, Any]] = []
    tokens_list = [int(t) for t in args.tokens.split(",")]
    for model in args.models.split(","):
        for tokens in tokens_list:
            if not args.experts:
                break
            sweep = expert_variants(args.broad) if (model == "qwen3-30b-a3b" or args.full) else []
            for kind in ("gate_up", "down"):
                jobs.append(("expert", (model, tokens, kind + "_previous"), GemmTiles(32, 128, 1, 2)))
                jobs += [("expert", (model, tokens, kind), t) for t in sweep]
            jobs += [("expert", (model, tokens, "gate_up_plain"), t) for t in sweep if isinstance(t, DecodeTiles)]
    if args.dense:
        for name in DENSE:
            for rows in tokens_list:
                jobs.append(("dense", (name, rows), (16, GemmTiles(32, 256, 4, 4))))
                jobs += [("dense", (name, rows), (rows, v[1])) for v in dense_variants(args.broad, args.deep)
                         if ((v[1].split_k <= 2 and v[1].block_n >= 64) if name == "head" else v[1].block_n <= 64)]
    return jobs


@functools.cache
def _case(kind: str, key: tuple[Any, ...]) -> Any:
    dev = torch.device("cuda")
    return Expert(key[0], key[1], dev) if kind == "expert" else Dense(key[0], key[1], dev)


def _fn(job: tuple[str, Any, Any]) -> Callable[[], torch.Tensor]:
    kind, key, variant = job
    case = _case(kind, key[:2])
    if kind == "expert":
        return case.run(key[2], variant)
    return case.run(variant[0], variant[1])


def _compile(jobs: list[tuple[str, Any, Any]]) -> int:
    """Worker: run each job once (Triton compiles and caches it on disk)."""
    failed = 0
    for job in jobs:
        try:
            _fn(job)()
        except Exception:
            failed += 1
    torch.cuda.synchronize()
    return failed


def _check(job: tuple[str, Any, Any], out: torch.Tensor, again: torch.Tensor) -> dict[str, Any]:
    kind, key, variant = job
    case = _case(kind, key[:2])
    row: dict[str, Any] = {"deterministic": bool(torch.equal(out, again))}
    if kind == "dense":
        row["rel_err"] = _rel(out, case.ref)
        return row
    name = key[2]
    if name.startswith("gate_up"):
        row["rel_err"] = _rel(out, case.ref_act)
        if name == "gate_up" and isinstance(variant, DecodeTiles):
            plain = silu_mul(decode_gemm(case.x, case.gate_up, case.align, case.k, variant, gather_rows=True))
            row["equals_unfused"] = bool(torch.equal(out, plain))
    else:
        row["rel_err"] = _rel(out, case.ref_down)
    return row


def _bytes(job: tuple[str, Any, Any]) -> int:
    kind, key, _ = job
    case = _case(kind, key[:2])
    if kind == "dense":
        return case.bytes
    return case.bytes_gate_up if key[2].startswith("gate_up") else case.bytes_down


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/q8_0_decode_sweep_h200.json")
    ap.add_argument("--tokens", default="32,64")
    ap.add_argument("--models", default=",".join(EXPERT_MODELS))
    ap.add_argument("--full", action="store_true", help="sweep every expert model (default: Qwen3-30B-A3B only)")
    ap.add_argument("--no-dense", dest="dense", action="store_false")
    ap.add_argument("--no-experts", dest="experts", action="store_false")
    ap.add_argument("--deep", action="store_true", help="dense tiles with more stages and wider K steps too")
    ap.add_argument("--broad", action="store_true", help="the whole neighbourhood of the chosen tiles (~600 variants)")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    args = ap.parse_args()
    dev = torch.device("cuda")
    for tokens in (32, 64):  # the one-launch alignment (was a single program: 16.7 us at 32 tokens)
        index = torch.topk(torch.rand(tokens, 128, device=dev), 8, dim=-1).indices.to(torch.int32)
        print(f"align {tokens} tokens: {_graph_ms(functools.partial(moe_align_fused, index, 128, 16)) * 1e3:.1f} us", flush=True)
    jobs = _jobs(args)
    print(f"{len(jobs)} variants; compiling in {args.workers} processes", flush=True)
    chunks = [jobs[i::args.workers] for i in range(args.workers)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        failed = sum(pool.map(_compile, chunks))
    print(f"compiled ({failed} failed)", flush=True)
    results: list[dict[str, Any]] = []
    meta = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for n, job in enumerate(jobs):
        if n % 50 == 0:  # partial results survive a time limit
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({**meta, "partial": True, "results": results}))
            print(f"timed {n}/{len(jobs)}", flush=True)
        kind, key, variant = job
        entry: dict[str, Any] = {"case": kind, "key": list(key), "variant": repr(variant)}
        try:
            fn = _fn(job)
            out = fn().clone()
            again = fn().clone()
            entry.update(_check(job, out, again))
            ms = _graph_ms(fn)
        except Exception as exc:
            entry["error"] = repr(exc)[:160]
            results.append(entry)
            continue
        entry["us"] = ms * 1e3
        entry["tb_s"] = _bytes(job) / ms / 1e9
        results.append(entry)
    best: dict[str, Any] = {}
    for entry in results:
        if "us" not in entry or entry["rel_err"] > 2e-2 or not entry["deterministic"]:
            continue
        name = "/".join(str(v) for v in entry["key"])
        if name not in best or entry["us"] < best[name]["us"]:
            best[name] = entry
    print(f"{'case':34s} {'baseline us':>11s} {'best us':>8s} {'TB/s':>6s}  variant", flush=True)
    for name, entry in best.items():
        base = [e for e in results if "/".join(str(v) for v in e["key"]) in (name, name + "_previous")
                and ("_previous" in str(e["key"][-1]) or "GemmTiles" in e["variant"]) and "us" in e]
        base_us = base[0]["us"] if base else float("nan")
        print(f"{name:34s} {base_us:11.1f} {entry['us']:8.1f} {entry['tb_s']:6.2f}  {entry['variant']}", flush=True)
    bad = [e for e in results if "us" in e
           and (not e["deterministic"] or e.get("equals_unfused") is False or e["rel_err"] > 2e-2)]
    chosen = {"gate_up": repr(DECODE_Q8_0.gate_up), "down": repr(DECODE_Q8_0.down)}  # each GEMM its own tiles
    for e in results:
        if e["case"] == "expert" and "us" in e and e["variant"] == chosen.get(e["key"][2]):
            print(f"chosen {'/'.join(map(str, e['key']))}: {e['us']:.1f} us {e['tb_s']:.2f} TB/s", flush=True)
    print(f"{len(bad)} variants failed a check: {[(e['key'], e['variant']) for e in bad][:6]}", flush=True)
    doc = {**meta, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "best": best,
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
