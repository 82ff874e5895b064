"""A/B of the decode GEMM's TMA boxes on the GPU, same process: one ``(BN, block_k)`` box a K step (``wide``)
against one ``(BN, 32)`` box a 32-column group, for Qwen3-30B-A3B's experts and dense projections; every
variant's output is compared with the first one's (``torch.equal``: same arithmetic, same bits).

    python3 bench/q8_0_decode_wide_ab.py                 # -> $OUT/ab_wide_h200.json, best_variant.txt
    AB_SECOND=1 python3 bench/q8_0_decode_wide_ab.py     # wide boxes around the chosen tiles
    AB_THIRD=1 python3 bench/q8_0_decode_wide_ab.py      # K steps up to 256, narrower tiles, the head

The first results (q8_0_decode_wide_tma_h200.json) also timed per-group scale loads (``gs``), a kernel
switch of commit 98d1c3b since removed (slower).
"""
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.moe_decode import _graph_ms
from bench.q8_0_decode_sweep import Dense, Expert
from stagewise.kernels.moe_decode_triton import DecodeTiles as D
from stagewise.kernels.q8_0_gemm import decode_tiles

dev = torch.device("cuda")
rows = []


def run(case, kind, label, fn, nbytes, base_out):
    out = fn()
    again = fn()
    same = bool(torch.equal(out, base_out)) if base_out is not None else True
    ms = min(_graph_ms(fn) for _ in range(3))
    r = dict(case=case, kind=kind, variant=label, us=round(ms * 1e3, 2), tb_s=round(nbytes / ms / 1e9, 3),
             equal_base=same, deterministic=bool(torch.equal(out, again)))
    print(json.dumps(r), flush=True)
    rows.append(r)
    return out


def vary(base: D):
    yield "base", base
    yield "wide", dataclasses.replace(base, wide=True)


best = {}
SECOND = os.environ.get("AB_SECOND") == "1"
THIRD = os.environ.get("AB_THIRD") == "1"
for tokens in ((32, 64) if not SECOND else (32,)):
    ex = Expert("qwen3-30b-a3b", tokens, dev)
    if THIRD:  # K steps up to 256 wide, narrower tiles, and the head
        W = functools.partial(D, split_k=1, swap=True, tma=True, wide=True)
        gu = [W(32, 128, 2, 3), W(32, 256, 2, 2), W(32, 256, 2, 3), W(64, 256, 2, 2), W(32, 128, 2, 4), W(32, 128, 2, 2),
              W(16, 128, 1, 3), W(16, 256, 1, 3), W(32, 64, 2, 4), W(64, 128, 2, 3)]
        dn = [W(64, 64, 2, 3), W(32, 64, 2, 3), W(32, 64, 2, 4), W(64, 64, 2, 2), W(32, 128, 2, 3), W(64, 256, 2, 2),
              W(32, 256, 2, 2), W(16, 64, 1, 4), W(128, 64, 2, 3), W(32, 128, 2, 2)]
        cases = (("gate_up", [("", t) for t in gu], ex.bytes_gate_up), ("down", [("", t) for t in dn], ex.bytes_down))
    elif SECOND:
        gu = [D(64, 128, 2, 2, 1, True, True), D(64, 128, 2, 3, 1, True, True, True), D(64, 128, 2, 4, 1, True, True, True),
              D(64, 64, 2, 4, 1, True, True, True), D(64, 64, 2, 5, 1, True, True, True), D(32, 128, 1, 3, 1, True, True, True),
              D(32, 128, 1, 4, 1, True, True, True), D(128, 128, 4, 3, 1, True, True, True), D(64, 128, 4, 3, 1, True, True, True),
              D(32, 128, 2, 3, 1, True, True, True), D(64, 32, 2, 6, 1, True, True, True)]
        dn = [D(64, 64, 2, 3, 1, True, True), D(64, 64, 2, 3, 1, True, True, True), D(64, 64, 2, 5, 1, True, True, True),
              D(64, 32, 2, 4, 1, True, True, True), D(64, 32, 2, 6, 1, True, True, True), D(32, 64, 1, 3, 1, True, True, True),
              D(32, 64, 1, 5, 1, True, True, True), D(128, 64, 4, 3, 1, True, True, True), D(64, 128, 2, 3, 1, True, True, True),
              D(32, 128, 1, 3, 1, True, True, True), D(64, 64, 4, 3, 1, True, True, True)]
        cases = (("gate_up", [("", t) for t in gu], ex.bytes_gate_up), ("down", [("", t) for t in dn], ex.bytes_down))
    else:
        gu_bases = [D(64, 128, 2, 2, 1, True, True), D(64, 128, 2, 3, 1, True, True), D(64, 64, 2, 3, 1, True, True)]
        dn_bases = [D(64, 64, 2, 3, 1, True, True), D(64, 128, 2, 2, 1, True, True), D(64, 64, 2, 4, 1, True, True)]
        cases = (("gate_up", [v for b in gu_bases for v in vary(b)], ex.bytes_gate_up),
                 ("down", [v for b in dn_bases for v in vary(b)], ex.bytes_down))
    for kind, variants, nbytes in cases:
        base_out = None
        for label, t in variants:
            try:
                out = run(f"experts/{tokens}", kind, f"{label} {t}", ex.run(kind, t), nbytes, base_out)
            except Exception as e:
                print("FAILED", kind, label, t, repr(e)[:300], flush=True)
                continue
            if base_out is None:
                base_out = out
            us = rows[-1]["us"]
            if tokens == 32 and (kind not in best or us < best[kind][0]):
                best[kind] = (us, t)
    if THIRD:
        hd = Dense("head", tokens, dev)
        bm, t0 = decode_tiles(tokens, 151936, 2048)
        base_out = None
        for t in (t0, dataclasses.replace(t0, wide=True), D(128, 128, 2, 3, 1, True, True, True),
                  D(64, 128, 2, 3, 1, True, True, True), D(128, 256, 4, 2, 1, True, True, True),
                  D(256, 128, 4, 3, 1, True, True, True), D(128, 128, 4, 4, 1, True, True, True)):
            try:
                out = run(f"dense/{tokens}", "head", str(t), hd.run(bm, t), hd.bytes, base_out)
            except Exception as e:
                print("FAILED head", t, repr(e)[:300], flush=True)
                continue
            base_out = base_out if base_out is not None else out
            if tokens == 32 and ("head" not in best or rows[-1]["us"] < best["head"][0]):
                best["head"] = (rows[-1]["us"], t)
    if SECOND or THIRD:
        continue
    for name in ("qkv", "o"):
        dn = Dense(name, tokens, dev)
        n, k = (5120, 2048) if name == "qkv" else (2048, 4096)
        bm, t0 = decode_tiles(tokens, n, k)
        base_out = None
        for label, t in vary(t0):
            out = run(f"dense/{tokens}", name, f"{label} {t}", dn.run(bm, t), dn.bytes, base_out)
            base_out = base_out if base_out is not None else out
            if tokens == 32 and (name not in best or rows[-1]["us"] < best[name][0]):
                best[name] = (rows[-1]["us"], t)


def spec(t: D) -> str:
    return ",".join(str(int(v)) for v in (t.block_n, t.block_k, t.num_warps, t.num_stages, t.swap, t.tma, t.split_k,
                                           t.wide))


out_dir = Path(os.environ.get("OUT", "/tmp"))
variant = f"gate_up={spec(best['gate_up'][1])}+down={spec(best['down'][1])}"
if "head" in best:
    variant += f"+head={spec(best['head'][1])}"
dq = best.get("qkv", (0, D(32, 128, 2, 3)))[1]
if dq.wide:
    variant += f"+dense={spec(dataclasses.replace(dq, split_k=1))}"
print("BEST", {k: (v[0], str(v[1])) for k, v in best.items()}, variant, flush=True)
(out_dir / "best_variant.txt").write_text(variant)
(out_dir / ("ab_wide3_h200.json" if THIRD else "ab_wide2_h200.json" if SECOND else "ab_wide_h200.json")).write_text(json.dumps(dict(command=("AB_THIRD=1 " if THIRD else "AB_SECOND=1 " if SECOND else "") + "python3 bench/q8_0_decode_wide_ab.py", rows=rows,
                                                           best_variant=variant), indent=1))
