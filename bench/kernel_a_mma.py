"""Kernel A's orientation, an experiment: Q4_K at 1-16 rows with the weight tile as the dot's second operand.

Kernel A (``packed_matmul`` up to 16 rows) dots the converted weight tile ``(BN, 32)`` against the rows'
activations ``(32, 16)``: Triton makes that a warpgroup MMA whose weight operand sits in registers, and waits on
each one before the next group converts (``bench/results/kquant_profile/README.md``: ~760 GB/s, latency-bound).
Here the same values are dotted the other way round, ``x (16, 32) @ w.T (32, BN)``: 16 rows are below a warpgroup
MMA's 64, so Triton issues per-warp MMAs (``mma.sync``), which need no warpgroup wait. Each scale group's
``sum(x)`` (the min term of ``d·sc·u - dmin·m``) is read from a ``(rows, K / 32)`` float32 table made before the
launch (``sx``), or left out (``no-min``: wrong values, the bound of the orientation alone). K is split over
programs as ``packed_matmul`` splits it (partials added atomically: timing only); ``dequantized``: kernel B's
values (rounded once, dots chained) the same way round. Beside ``packed_matmul`` on the same planes at
Llama-3.1-8B's shapes in either of its orientations (``rows-first``: ``ROWS_FIRST_MAX_ROWS``, every packed type,
``sum(x)`` summed), and kernel B rows first from one row, its quants by Triton's ops or by the inline PTX
(``B_NIBBLE_ASM``: the standalone ``dequantized`` kernel's arithmetic, which timed best at 8 rows on an H100,
``bench/results/kquant_files/session16/``), inside CUDA graphs over rotated weight copies. GPU only.

    PYTHONPATH=. python3 bench/kernel_a_mma.py --rows 8,16,32,64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from gguf.constants import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import graph_us, rel_err
from bench.packed_gemv import _random_raw
from stagewise.kernels import packed_decode_triton, packed_steps_triton
from stagewise.kernels import packed_matmul as packed_matmul_module
from stagewise.kernels.packed_matmul import dense_tiles, packed_matmul
from stagewise.kernels.packed_steps_triton import _k_meta, _k_scale, _k_scale_bytes
from stagewise.kernels.quant_bf16_triton import nibbles_bf16
from stagewise.spec.packed_types import row_bytes
from stagewise.weights.quant.packed_weight import PackedWeight

T = GGMLQuantizationType
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate/up": (28672, 4096), "down": (4096, 14336)}
ROTATE_BYTES = 512 << 20


@triton.jit
def _kernel(a_ptr, sx_ptr, qs_ptr, meta_ptr, out_ptr, M, N, steps, split_k, stride_am, stride_sx, stride_qn,
            stride_mn, MIN: tl.constexpr, DEQ: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = pid % split_k
    pid_n = pid // split_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    n64 = tl.minimum(offs_n, N - 1).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    q_rows = qs_ptr + n64 * stride_qn
    m_rows = meta_ptr + n64 * stride_mn
    per_split = tl.cdiv(steps, split_k)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, steps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    l32 = tl.arange(0, 32)[None, :]
    for blk in range(first, last):
        k0 = blk * 256
        d, dmin, w1, w2, w3 = _k_meta(m_rows + blk * 16, n_ok)
        sc_lo, mn_lo, sc_hi, mn_hi = _k_scale_bytes(w1, w2, w3)
        for c in tl.static_range(4):
            lo, hi = nibbles_bf16(tl.load(q_rows[:, None] + blk * 128 + 32 * c + l32))  # (BN, 32): 128 + u
            for h in tl.static_range(2):
                sc, mn = _k_scale(sc_lo, mn_lo, sc_hi, mn_hi, 2 * c + h)
                x = tl.load(a_ptr + rows[:, None] * stride_am + (k0 + 64 * c + 32 * h + tl.arange(0, 32))[None, :],
                            mask=row_ok[:, None], other=0.0)  # (BM, 32)
                a = d * sc
                if DEQ:  # kernel B's way: each value a u - dmin m rounded to bf16 once, the dots chained
                    u = (lo if h == 0 else hi).to(tl.float32) - 128.0
                    w = (a[:, None] * u - (dmin * mn)[:, None]).to(tl.bfloat16)
                    acc = tl.dot(x, tl.trans(w), acc)
                else:
                    p = tl.dot(x, tl.trans(lo if h == 0 else hi))  # (BM, BN) = sum (128 + u) x
                    acc += a[None, :] * p
                if MIN and not DEQ:
                    sx = tl.load(sx_ptr + rows * stride_sx + blk * 8 + 2 * c + h, mask=row_ok, other=0.0)
                    acc += (-(dmin * mn) - 128.0 * a)[None, :] * sx[:, None]
    tl.atomic_add(out_ptr + rows[:, None] * N + offs_n[None, :], acc, mask=row_ok[:, None] & n_ok[None, :], sem="relaxed")


@triton.jit
def _magic_group_no_min(acc, w, x, a, b, CENTER: tl.constexpr, R: tl.constexpr):  # type: ignore[no-untyped-def]
    """Kernel A's group step without the ``sum(x)`` dot (``--kernel-a-no-min``)."""
    acc += packed_steps_triton._n(a, R) * packed_steps_triton._mm(w, x, None, R)
    return acc


def _variant(x: torch.Tensor, w: PackedWeight, b_only: bool, b_asm: bool) -> torch.Tensor:
    """``packed_matmul`` rows first (``ROWS_FIRST_MAX_ROWS``; with ``b_only`` kernel B from one row,
    ``A_MAX_ROWS`` 0; ``b_asm``: kernel B's quants by the inline PTX), the constants read at each launch."""
    saved = packed_decode_triton.ROWS_FIRST_MAX_ROWS, packed_matmul_module.A_MAX_ROWS, packed_decode_triton.B_NIBBLE_ASM
    packed_decode_triton.ROWS_FIRST_MAX_ROWS = 128
    packed_matmul_module.A_MAX_ROWS = 0 if b_only else saved[1]
    packed_decode_triton.B_NIBBLE_ASM = b_asm
    try:
        return packed_matmul(x, w)
    finally:
        packed_decode_triton.ROWS_FIRST_MAX_ROWS, packed_matmul_module.A_MAX_ROWS, packed_decode_triton.B_NIBBLE_ASM = saved


def mma_matmul(x: torch.Tensor, w: PackedWeight, split_k: int, block_n: int, warps: int, with_min: bool,
               dequantized: bool = False) -> torch.Tensor:
    m, k = x.shape
    n = w.qs.shape[0]
    out = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    sx = x.float().view(m, k // 32, 32).sum(-1) if with_min and not dequantized else out
    grid = (triton.cdiv(n, block_n) * split_k,)
    _kernel[grid](x, sx, w.qs, w.meta, out, m, n, k // 256, split_k, x.stride(0), sx.stride(0), w.qs.stride(0),
                  w.meta.stride(0), MIN=with_min, DEQ=dequantized, BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, num_warps=warps, num_stages=2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="8,16,32,64")
    ap.add_argument("--json", default="")
    ap.add_argument("--kernel-a-no-min", action="store_true",
                    help="kernel A itself without its sum(x) dot (wrong values: what that dot costs)")
    args = ap.parse_args()
    if args.kernel_a_no_min:  # before the first launch: Triton keys a kernel by its callees' sources
        packed_steps_triton._magic_group = _magic_group_no_min
    if not torch.cuda.is_available():
        print("bench/kernel_a_mma.py needs a CUDA GPU", file=sys.stderr)
        return 1
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    rows_out = []
    with torch.inference_mode():
        for label, (n, k) in SHAPES.items():
            nbytes = n * row_bytes(T.Q4_K, k)
            copies = max(2, min(32, ROTATE_BYTES // nbytes))
            ws = [PackedWeight.from_rows(_random_raw(T.Q4_K, n, k, dev), T.Q4_K, k) for _ in range(copies)]
            w64 = ws[0].dequantize(torch.float64)
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
                ref = x.double() @ w64.T
                split = dense_tiles(rows, n, k, T.Q4_K, dev)[1].split_k
                kernel = "kernel A" if rows <= 16 else "kernel B"
                fns = {kernel: lambda i, x=x, ws=ws: packed_matmul(x, ws[i]),
                       f"{kernel} rows-first": lambda i, x=x, ws=ws: _variant(x, ws[i], False, False),
                       "kernel B rows-first": lambda i, x=x, ws=ws: _variant(x, ws[i], True, False),
                       "kernel B rows-first asm": lambda i, x=x, ws=ws: _variant(x, ws[i], True, True)}
                for bn, warps in ((64, 4), (128, 4)):
                    s = max(1, split * 64 // bn)
                    fns[f"mma bn{bn} w{warps} dequantized"] = lambda i, x=x, ws=ws, s=s, bn=bn, wp=warps: mma_matmul(
                        x, ws[i], s, bn, wp, True, True)
                for bn, warps in ((64, 4), (128, 4), (64, 2)) if rows <= 16 else ():
                    s = max(1, split * 64 // bn)
                    fns[f"mma bn{bn} w{warps} sx"] = lambda i, x=x, ws=ws, s=s, bn=bn, wp=warps: mma_matmul(x, ws[i], s, bn, wp, True)
                    fns[f"mma bn{bn} w{warps} no-min"] = lambda i, x=x, ws=ws, s=s, bn=bn, wp=warps: mma_matmul(x, ws[i], s, bn, wp, False)
                row = {"shape": label, "n": n, "k": k, "rows": rows, "bytes": nbytes, "split": split}
                for name, fn in fns.items():
                    try:
                        err = rel_err(fn(0), ref)
                        us = graph_us(fn, copies)
                        row[name] = {"us": round(us, 2), "GBps": round(nbytes / us / 1e3, 1), "rel_err": err}
                    except Exception as exc:  # a config the compiler refuses is reported, not fatal
                        row[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                rows_out.append(row)
                print(f"{label:8s} rows {rows:2d} " + "  ".join(
                    f"{name}: {v['us']} us {v['GBps']} GB/s err {v['rel_err']:.1e}" if "us" in v else f"{name}: {v['error']}"
                    for name, v in row.items() if isinstance(v, dict)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "python3 " + " ".join(sys.argv),
                                               "device": torch.cuda.get_device_name(dev), "rows": rows_out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
