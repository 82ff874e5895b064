"""Does the experts' int8 layout bound the decode GEMM? Read bandwidth of the routed experts' weights in
the decode kernel's access pattern, stored as today (row-major ``(E, N, K)``) or pre-tiled so that each
``(64, 32)`` tile a program loads is one contiguous 2 KiB run (``(E, N/64, K/32, 64, 32)``).

The kernels only load and sum the int8 values (no scales, activations or dots): the difference between
the layouts is the memory system's alone. Qwen3-30B-A3B gate_up geometry (128 experts, 1,536 x 2,048),
the ~118 experts routed by 32 sequences, each program 64 rows of one expert, times inside a CUDA graph
(``bench/moe_decode._graph_ms``), beside a device-to-device copy of the same bytes.

    PYTHONPATH=. python3 bench/q8_0_layout_probe.py --out bench/results/q8_0_layout_probe_h200.json

Outcome (docs/performance.md): the tiled and a panel layout, built into the kernels at commit 7782c1e, made
the real decode GEMM slower than row-major; the loads alone do not predict it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.moe_decode import _graph_ms

E, N, K = 128, 1536, 2048


@triton.jit
def _read_kernel(q_ptr, experts_ptr, out_ptr, N, K, TILED: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUPS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n_tiles = N // BLOCK_N
    expert = tl.load(experts_ptr + pid // n_tiles).to(tl.int64)
    tile = pid % n_tiles
    r = tl.arange(0, BLOCK_N)
    c = tl.arange(0, 32)
    acc = tl.zeros((BLOCK_N, 32), dtype=tl.int32)
    for step in tl.range(0, K // (32 * GROUPS), num_stages=STAGES):
        for g in tl.static_range(GROUPS):
            kg = step * GROUPS + g
            if TILED:  # (E, N/BN, K/32, BN, 32): the tile is one contiguous run
                base = ((expert * n_tiles + tile) * (K // 32) + kg) * (BLOCK_N * 32)
                ptrs = q_ptr + base + r[:, None] * 32 + c[None, :]
            else:  # (E, N, K): BN rows of 32 bytes, K bytes apart
                ptrs = q_ptr + expert * N * K + (tile * BLOCK_N + r[:, None]).to(tl.int64) * K + kg * 32 + c[None, :]
            acc += tl.load(ptrs).to(tl.int32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


def _read(q: torch.Tensor, experts: torch.Tensor, out: torch.Tensor, tiled: bool, warps: int, groups: int,
          stages: int, block_n: int = 64) -> None:
    grid = (experts.numel() * (N // block_n),)
    _read_kernel[grid](q, experts, out, N, K, TILED=tiled, BLOCK_N=block_n, GROUPS=groups, STAGES=stages,
                       num_warps=warps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/q8_0_layout_probe_h200.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = torch.randint(-127, 128, (E, N, K), dtype=torch.int8, device=dev)
    tiled = rows.view(E, N // 64, 64, K // 32, 32).permute(0, 1, 3, 2, 4).contiguous()  # (E, N/64, K/32, 64, 32)
    routing = torch.topk(torch.rand(32, E, device=dev), 8, dim=-1).indices
    experts = torch.unique(routing).to(torch.int32)  # ascending, as the alignment orders them
    nbytes = experts.numel() * N * K
    out = torch.empty(experts.numel() * N, dtype=torch.int32, device=dev)
    sums = {}
    results = []
    for warps in (2, 4):
        for groups in (1, 4):
            for stages in (2, 3, 4):
                for name, q in (("row_major", rows), ("tiled", tiled)):
                    fn = functools.partial(_read, q, experts, out, name == "tiled", warps, groups, stages)
                    fn()
                    sums[name] = int(out.sum())
                    ms = _graph_ms(fn)
                    results.append({"layout": name, "warps": warps, "groups": groups, "stages": stages,
                                    "us": ms * 1e3, "tb_s": nbytes / ms / 1e9})
                    print(f"{name:9s} warps {warps} groups {groups} stages {stages}: {ms * 1e3:7.1f} us "
                          f"{nbytes / ms / 1e9:.2f} TB/s", flush=True)
                if sums["row_major"] != sums["tiled"]:
                    raise SystemExit("the two layouts summed to different totals: an indexing error")
    for block_n in (16, 32, 64):  # row-major, longer runs of each row per K step (no layout change)
        for groups in (8, 16):
            for stages in (2, 3):
                fn = functools.partial(_read, rows, experts, out, False, 2 if block_n < 64 else 4, groups, stages,
                                       block_n)
                ms = _graph_ms(fn)
                results.append({"layout": "row_major", "block_n": block_n, "groups": groups, "stages": stages,
                                "us": ms * 1e3, "tb_s": nbytes / ms / 1e9})
                print(f"row_major {block_n} rows, groups {groups} stages {stages}: {ms * 1e3:7.1f} us "
                      f"{nbytes / ms / 1e9:.2f} TB/s", flush=True)
    src = torch.empty(nbytes, dtype=torch.int8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = _graph_ms(lambda: dst.copy_(src))
    print(f"copy of the same bytes: {copy_ms * 1e3:.1f} us, {2 * nbytes / copy_ms / 1e9:.2f} TB/s read + written",
          flush=True)
    doc = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "experts": experts.numel(), "bytes": nbytes, "copy_us": copy_ms * 1e3,
           "copy_tb_s_read_plus_written": 2 * nbytes / copy_ms / 1e9, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
