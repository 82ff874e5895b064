"""Gated DeltaNet over a packed step on a GPU: the packed conv + chunked-rule kernels against today's per-sequence path.

Qwen3.6-35B-A3B / Qwen3.5 linear-attention dims (Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4 over 8,192
channels, bf16 activations, float32 state) for steps of several shapes (``--steps``: ``SxN`` terms
joined by ``+``, e.g. ``64x8+1x448`` = 64 segments of 8 tokens and one of 448). Every segment
continues a populated state entry and writes another. Per step, median milliseconds (CUDA events,
after warm-up) of:

- ``conv``, ``rule``, ``layer`` (conv then rule): the packed kernels (one launch + two);
- ``today``: today's path, one sequence at a time (``GatedDeltaNet.forward``'s conv, then
  ``chunked_gated_delta_rule``: torch UT transform + the Triton scan), host loop included;
  ``today_batched``: the same as one rectangle where every segment has the same length;
- ``fla``: flash-linear-attention's ``chunk_gated_delta_rule`` with ``cu_seqlens`` (states gathered
  from and scattered to the pool around it), where ``fla`` imports (optional oracle);

with the packed rule's max difference from the float32 torch reference (outputs relative to their
largest value, states absolute), a sweep of the rule's launch settings (value columns per scan
program, warps, pipeline stages, ``tl.dot`` precision), exactness checks on the GPU (a prompt split at
64-token boundaries over calls, and resumed from a snapshot, bit for bit as one call) and the indexed
decode kernels (64 rows, entry tensors vs consecutive entries).

    python bench/deltanet_packed.py --json bench/results/deltanet_packed_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import eager_ms
from stagewise.kernels.causal_conv_triton import packed_causal_conv_triton
from stagewise.kernels.deltanet_decode_triton import conv_step, delta_step
from stagewise.kernels.deltanet_packed_triton import packed_gated_delta_rule_triton
from stagewise.models.layers.decay_gates import DecayGates
from stagewise.models.layers.delta_rule import chunked_gated_delta_rule, packed_chunked_gated_delta_rule_reference
from stagewise.models.layers.packed_segments import PackedSegments

K_HEADS, V_HEADS, DK, DV, KERNEL = 16, 32, 128, 128, 4
KEY_DIM, VALUE_DIM = K_HEADS * DK, V_HEADS * DV
CHANNELS = 2 * KEY_DIM + VALUE_DIM
DTYPE = torch.bfloat16
SWEEP = [  # block_v, scan_warps, scan_stages, prep_warps, precision (the defaults first)
    (32, 8, 1, 4, None), (16, 4, 1, 4, None), (32, 4, 1, 4, None), (64, 8, 1, 4, None), (64, 8, 2, 4, None),
    (32, 8, 2, 4, None), (32, 8, 1, 8, None), (32, 8, 1, 4, "tf32x3"), (32, 8, 1, 4, "ieee"),
]


def parse_step(spec: str) -> list[int]:
    lengths: list[int] = []
    for term in spec.split("+"):
        count, tokens = term.split("x")
        lengths += [int(tokens)] * int(count)
    return lengths


def _use_tiny_dims() -> None:
    """``--tiny``: a smoke run of this script on CPU through Triton's interpreter (TRITON_INTERPRET=1)."""
    global K_HEADS, V_HEADS, DK, DV, KEY_DIM, VALUE_DIM, CHANNELS
    K_HEADS, V_HEADS, DK, DV = 2, 4, 32, 32
    KEY_DIM, VALUE_DIM = K_HEADS * DK, V_HEADS * DV
    CHANNELS = 2 * KEY_DIM + VALUE_DIM


class Problem:
    """One step's inputs: conv inputs, the conv output's q/k/v views, gates, pools and segments."""

    def __init__(self, lengths: list[int], dev: torch.device, seed: int, entries: int = 0) -> None:
        gen = torch.Generator(device=dev).manual_seed(seed)
        count, tokens = len(lengths), sum(lengths)
        self.lengths = lengths
        entries = max(entries, 1 + 2 * count)  # the zero entry, reads, writes
        self.read = [1 + s for s in range(count)]
        self.write = [1 + count + s for s in range(count)]
        self.segments = PackedSegments.build(lengths, self.read, self.write, dev)
        self.x = torch.randn(tokens, CHANNELS, device=dev, generator=gen).to(DTYPE)  # (N, C) conv inputs
        self.weight = (torch.randn(CHANNELS, 1, KERNEL, device=dev, generator=gen) * 0.5).to(DTYPE)
        self.conv_pool = torch.randn(entries, CHANNELS, KERNEL, device=dev, generator=gen).to(DTYPE)
        self.conv_pool[0] = 0
        self.pool = torch.randn(entries, V_HEADS, DK, DV, device=dev, generator=gen) * 0.05
        self.pool[0] = 0
        # the gates' inputs (b, a per token; A_log, dt_bias per head) and their values (beta, float32 log decay g)
        b, a = (torch.randn(tokens, V_HEADS, device=dev, generator=gen).to(DTYPE) for _ in range(2))
        a_log = torch.rand(V_HEADS, device=dev, generator=gen) * 2 - 3
        dt_bias = torch.randn(V_HEADS, device=dev, generator=gen)
        self.gates = DecayGates(b, a, a_log, dt_bias)
        self.beta, self.g = self.gates.values()
        self.mixed = torch.empty_like(self.x)  # the conv's output, whose views q, k, v are
        self.out = torch.empty(tokens, V_HEADS, DV, device=dev, dtype=DTYPE)
        packed_causal_conv_triton(self.x, self.weight, self.conv_pool, self.segments, out=self.mixed)

    def qkv(self, mixed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mixed = self.mixed if mixed is None else mixed
        q, k, v = mixed.split([KEY_DIM, KEY_DIM, VALUE_DIM], dim=-1)
        n = mixed.shape[0]
        return q.view(n, K_HEADS, DK), k.view(n, K_HEADS, DK), v.view(n, V_HEADS, DV)

    def conv(self) -> None:
        packed_causal_conv_triton(self.x, self.weight, self.conv_pool, self.segments, out=self.mixed)

    def rule(self, **settings: Any) -> None:
        q, k, v = self.qkv()
        packed_gated_delta_rule_triton(q, k, v, self.gates, self.pool, self.segments, out=self.out, **settings)

    def layer(self) -> None:
        self.conv()
        self.rule()

    def today(self) -> None:
        """``GatedDeltaNet.forward``'s conv and rule, one sequence at a time (state copied in and out)."""
        lo = 0
        for n, src, dst in zip(self.lengths, self.read, self.write, strict=True):
            self._today_rows(lo, 1, n, [src], [dst])
            lo += n

    def today_batched(self) -> None:
        """The same as one ``(B, T)`` rectangle (equal lengths only)."""
        self._today_rows(0, len(self.lengths), self.lengths[0], self.read, self.write)

    def _today_rows(self, lo: int, batch: int, steps: int, read: list[int], write: list[int]) -> None:
        rows = slice(lo, lo + batch * steps)
        qkv = self.x[rows].view(batch, steps, CHANNELS)
        window = torch.cat([self.conv_pool[read], qkv.transpose(1, 2)], dim=-1)  # (B, C, K + T)
        self.conv_pool[write] = window[..., -KERNEL:]
        mixed = F.conv1d(window[..., 1:].to(self.weight.dtype), self.weight, groups=CHANNELS)
        mixed = F.silu(mixed).to(DTYPE).transpose(1, 2)  # (B, T, C)
        q, k, v = torch.split(mixed, [KEY_DIM, KEY_DIM, VALUE_DIM], dim=-1)
        g, beta = (t[rows].view(batch, steps, V_HEADS) for t in (self.g, self.beta))
        _, state = chunked_gated_delta_rule(q.reshape(batch, steps, K_HEADS, DK), k.reshape(batch, steps, K_HEADS, DK),
                                            v.reshape(batch, steps, V_HEADS, DV), g, beta, self.pool[read])
        self.pool[write] = state

    def fla(self, chunk_gated_delta_rule: Callable[..., Any]) -> torch.Tensor:
        q, k, v = self.qkv()
        offsets = torch.tensor(self.segments.offsets, dtype=torch.long, device=q.device)
        initial = self.pool[self.read]  # (S, Hv, Dk, Dv): fla takes states by position, not index
        out, final = chunk_gated_delta_rule(q[None], k[None], v[None], self.g[None], self.beta[None],
                                            scale=DK**-0.5, initial_state=initial, output_final_state=True,
                                            cu_seqlens=offsets, use_qk_l2norm_in_kernel=True)
        self.pool[self.write] = final.float()
        return out[0]

    def reference(self) -> torch.Tensor:
        """The float32 torch reference's readout (float32 copies of q/k/v; pool untouched)."""
        q, k, v = (t.float() for t in self.qkv())
        return packed_chunked_gated_delta_rule_reference(q, k, v, self.gates, self.pool.clone(), self.segments)


def accuracy(problem: Problem, **settings: Any) -> dict[str, float]:
    """The packed rule against the float32 torch reference on the same values: its bf16 output (rounding
    included), its output from float32 copies of q/k/v with the same settings (the kernel's arithmetic
    alone: TF32 products), and the final states."""
    q, k, v = problem.qkv()
    q32, k32, v32 = q.float(), k.float(), v.float()
    want_pool, got_pool = problem.pool.clone(), problem.pool.clone()
    want = packed_chunked_gated_delta_rule_reference(q32, k32, v32, problem.gates, want_pool, problem.segments)
    got = packed_gated_delta_rule_triton(q, k, v, problem.gates, got_pool, problem.segments, **settings)
    settings = {"precision": "tf32", **{n: s for n, s in settings.items() if s is not None}}
    got32 = packed_gated_delta_rule_triton(q32, k32, v32, problem.gates, problem.pool.clone(),
                                           problem.segments, **settings)
    written = torch.tensor(problem.write, device=q.device)
    scale = want.abs().max()
    return {"max_rel_diff_out": float((got.float() - want).abs().max() / scale),
            "max_rel_diff_out_f32_inputs": float((got32 - want).abs().max() / scale),
            "max_abs_diff_state": float((got_pool[written] - want_pool[written]).abs().max()),
            "max_abs_state": float(want_pool[written].abs().max())}


def split_checks(dev: torch.device) -> dict[str, bool]:
    """A 448-token prompt (beside a 9-token one) in one call = at 64-token boundaries over 3 calls =
    resumed from its snapshot after 128 tokens: outputs and states bit for bit, conv and rule."""
    whole = Problem([448, 9], dev, seed=5, entries=10)
    segments = PackedSegments.build([448, 9], [1, 2], [3, 4], dev, snap=[5, 0], snap_at=[128, 0])
    conv_pool, pool = whole.conv_pool.clone(), whole.pool.clone()
    mixed = packed_causal_conv_triton(whole.x, whole.weight, conv_pool, segments)
    out = packed_gated_delta_rule_triton(*whole.qkv(mixed), whole.gates, pool, segments)
    split_conv, split_pool, pieces, conv_pieces, src = whole.conv_pool.clone(), whole.pool.clone(), [], [], 1
    for lo, hi, dst in ((0, 64, 4), (64, 192, 6), (192, 448, 3)):
        rows = list(range(lo, hi)) + list(range(448, 457))
        piece = PackedSegments.build([hi - lo, 9], [src, 2], [dst, 7], dev)
        m = packed_causal_conv_triton(whole.x[rows], whole.weight, split_conv, piece)
        conv_pieces.append(m[: hi - lo])
        gates = DecayGates(whole.gates.b[rows], whole.gates.a[rows], whole.gates.a_log, whole.gates.dt_bias)
        pieces.append(packed_gated_delta_rule_triton(*whole.qkv(m), gates, split_pool, piece)[: hi - lo])
        src = dst
    resumed_conv, resumed_pool = whole.conv_pool.clone(), whole.pool.clone()
    resumed_conv[8], resumed_pool[8] = conv_pool[5], pool[5]
    tail = PackedSegments.build([320], [8], [9], dev)
    m = packed_causal_conv_triton(whole.x[128:448], whole.weight, resumed_conv, tail)
    resumed = packed_gated_delta_rule_triton(*whole.qkv(m), whole.gates.rows(128, 448), resumed_pool, tail)
    return {"split_conv_equal": torch.equal(torch.cat(conv_pieces), mixed[:448]),
            "split_rule_equal": torch.equal(torch.cat(pieces), out[:448]),
            "split_state_equal": torch.equal(split_pool[3], pool[3]) and torch.equal(split_conv[3], conv_pool[3]),
            "resumed_equal": torch.equal(resumed, out[128:448]) and torch.equal(resumed_pool[9], pool[3])
            and torch.equal(resumed_conv[9], conv_pool[3])}


def decode_rows(dev: torch.device, warmup: int, reps: int, batch: int = 64) -> dict[str, Any]:
    """conv_step + delta_step for ``batch`` rows: entries by index tensors vs consecutive entries."""
    gen = torch.Generator(device=dev).manual_seed(9)
    x = torch.randn(batch, CHANNELS, device=dev, generator=gen).to(DTYPE)
    weight = (torch.randn(CHANNELS, 1, KERNEL, device=dev, generator=gen) * 0.5).to(DTYPE)
    conv_pool = torch.randn(2 * batch, CHANNELS, KERNEL, device=dev, generator=gen).to(DTYPE)
    pool = torch.randn(2 * batch, V_HEADS, DK, DV, device=dev, generator=gen) * 0.05
    b, a = (torch.randn(batch, V_HEADS, device=dev, generator=gen).to(DTYPE) for _ in range(2))
    a_log, dt_bias = torch.randn(V_HEADS, device=dev, generator=gen), torch.randn(V_HEADS, device=dev, generator=gen)
    read = torch.arange(batch, dtype=torch.int32, device=dev)
    write = read + batch

    def run(r: torch.Tensor | int, w: torch.Tensor | int) -> torch.Tensor:
        mixed = conv_step(x, weight, conv_pool, r, w)
        return delta_step(mixed, b, a, a_log, dt_bias, pool, r, w, K_HEADS, DK)

    indexed = run(read, write)
    rows = run(0, batch)
    return {"rows": batch, "indexed_ms": eager_ms(functools.partial(run, read, write), warmup, reps),
            "consecutive_ms": eager_ms(functools.partial(run, 0, batch), warmup, reps), "equal": torch.equal(indexed, rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="1x512,8x64,64x8+1x448,1x2048")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-sweep", action="store_true", help="skip the rule's launch-settings sweep")
    ap.add_argument("--json", default="bench/results/deltanet_packed_h200.json")
    ap.add_argument("--tiny", action="store_true", help="small dims on CPU (TRITON_INTERPRET=1): checks the script runs")
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    if args.tiny:
        _use_tiny_dims()
        dev = torch.device("cpu")
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as error:
        chunk_gated_delta_rule, fla_note = None, f"not importable: {error}"
    else:
        fla_note = "imported"
    rows, sweep = [], []
    for spec in args.steps.split(","):
        problem = Problem(parse_step(spec), dev, seed=0)
        row: dict[str, Any] = {"step": spec, "segments": len(problem.lengths), "tokens": sum(problem.lengths),
                               "chunks": problem.segments.chunk_count}
        for name, fn in (("conv", problem.conv), ("rule", problem.rule), ("layer", problem.layer),
                         ("today", problem.today)):
            row[f"{name}_ms"] = eager_ms(fn, args.warmup, args.reps)
        if len(set(problem.lengths)) == 1 and len(problem.lengths) > 1:
            row["today_batched_ms"] = eager_ms(problem.today_batched, args.warmup, args.reps)
        if chunk_gated_delta_rule is not None:
            try:
                row["fla_ms"] = eager_ms(functools.partial(problem.fla, chunk_gated_delta_rule), args.warmup, args.reps)
                want = problem.reference()
                got = problem.fla(chunk_gated_delta_rule).float()
                row["fla_max_rel_diff_out"] = float((got - want).abs().max() / want.abs().max())
            except Exception as error:  # an optional oracle: record why it did not run
                row["fla_error"] = f"{type(error).__name__}: {error}"[:300]
        row["speedup_vs_today"] = row["today_ms"] / row["layer_ms"]
        row.update(accuracy(problem))
        rows.append(row)
        print(f"{spec:>14}: conv {row['conv_ms']:.3f} rule {row['rule_ms']:.3f} layer {row['layer_ms']:.3f} ms | "
              f"today {row['today_ms']:.3f}" + (f" (rectangle {row['today_batched_ms']:.3f})" if "today_batched_ms" in row else "")
              + (f" | fla {row['fla_ms']:.3f} (diff {row['fla_max_rel_diff_out']:.1e})" if "fla_ms" in row else "")
              + f" | {row['speedup_vs_today']:.1f}x | out rel diff {row['max_rel_diff_out']:.1e} "
              f"({row['max_rel_diff_out_f32_inputs']:.1e} from float32 inputs), "
              f"state diff {row['max_abs_diff_state']:.1e} (of {row['max_abs_state']:.1e})", flush=True)
        if args.no_sweep:
            continue
        for block_v, scan_warps, scan_stages, prep_warps, precision in SWEEP:
            settings = {"block_v": block_v, "scan_warps": scan_warps, "scan_stages": scan_stages,
                        "prep_warps": prep_warps, "precision": precision}
            entry: dict[str, Any] = {"step": spec, **settings}
            try:
                entry["rule_ms"] = eager_ms(functools.partial(problem.rule, **settings), args.warmup, args.reps)
                entry.update(accuracy(problem, **settings))
            except Exception as error:  # e.g. OutOfResources: record it, try the next
                entry["error"] = f"{type(error).__name__}: {error}"[:300]
            sweep.append(entry)
            print(f"    sweep {settings}: " + (f"{entry['rule_ms']:.3f} ms, out rel diff {entry['max_rel_diff_out']:.1e}"
                                                if "rule_ms" in entry else entry["error"]), flush=True)
    checks = split_checks(dev)
    print(f"exactness on the GPU: {checks}", flush=True)
    decode = decode_rows(dev, args.warmup, args.reps)
    print(f"decode rows: {decode}", flush=True)
    import triton

    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)"
    report = {"command": "python " + " ".join(sys.argv), "device": device,
              "date": datetime.datetime.now(datetime.UTC).isoformat(), "torch": torch.__version__,
              "triton": triton.__version__, "fla": fla_note,
              "dims": {"k_heads": K_HEADS, "v_heads": V_HEADS, "dk": DK, "dv": DV, "kernel": KERNEL,
                       "channels": CHANNELS, "dtype": str(DTYPE)},
              "rows": rows, "sweep": sweep, "checks": checks, "decode": decode}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if all(checks.values()) and decode["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
