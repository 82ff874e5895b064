"""Batched-decode MoE experts on the GPU: the prefill grouped GEMM vs the decode kernel, inside CUDA graphs.

For the Qwen3-30B-A3B (E=128, K=8, H=2048, I=768) and Qwen3.6-35B-A3B (E=256, K=8, H=2048, I=512) Q8_0
expert geometries and N routed tokens (batched decode: 8-64 sequences), times with CUDA-graph replay
(launch cost as in a decode step): the torch alignment vs the one-launch alignment, each expert GEMM
(gate_up, down) per tile config with its weight bandwidth (bytes of the experts actually routed to),
and the whole experts (old config vs new). Checks the decode path against the old one (allclose) and
that a replay equals an eager call. Prints a table, writes JSON. (The tile sweeps behind the decode
kernels' tiles, ``bench/q8_0_decode_sweep.py``, are in git at ``1f282a2``.)

    PYTHONPATH=. python3 bench/moe_decode.py --out bench/results/moe_decode_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_timing import graph_us
from bench.moe_grouped import _quantize  # the same random Q8_0 weights as the prefill bench
from stagewise.kernels.moe_align import moe_align
from stagewise.kernels.moe_align_triton import moe_align_fused
from stagewise.kernels.moe_decode_triton import DECODE_Q8_0
from stagewise.kernels.moe_experts import grouped_swiglu_experts
from stagewise.kernels.moe_grouped_triton import TILES_DECODE, GroupedConfig, grouped_gemm
from stagewise.kernels.silu_mul_triton import silu_mul

MODELS = {"qwen3-30b-a3b": (128, 8, 2048, 768), "qwen3.6-35b-a3b": (256, 8, 2048, 512)}  # E, K, H, I


def _graph_ms(fn: Callable[[], Any], calls: int = 20) -> float:
    """Median ms of one call, replayed from a CUDA graph of ``calls`` calls (launch cost as in a graph)."""
    return graph_us(lambda _i: fn(), calls) / 1e3


def _case(model: str, tokens: int, dev: torch.device) -> dict[str, Any]:
    e, k, h, i = MODELS[model]
    torch.manual_seed(0)
    gate_up = _quantize(torch.randn(e, 2 * i, h, device=dev) * 0.02)
    down = _quantize(torch.randn(e, h, i, device=dev) * 0.02)
    x = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
    residual = torch.randn(tokens, h, device=dev).to(torch.bfloat16)
    logits = torch.randn(tokens, e, device=dev)
    top_weight, top_index = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    top_weight = (top_weight / top_weight.sum(-1, keepdim=True)).to(torch.bfloat16)
    top_index = top_index.to(torch.int32)
    used = int(torch.unique(top_index).numel())
    bytes_gate_up = used * 2 * i * h * 34 // 32  # int8 values + one f16 scale per 32
    bytes_down = used * h * i * 34 // 32
    row: dict[str, Any] = {"model": model, "tokens": tokens, "experts_used": used}
    row["align_torch_ms"] = _graph_ms(lambda: moe_align(top_index, e, 16))
    row["align_fused_ms"] = _graph_ms(lambda: moe_align_fused(top_index, e, 16))
    align = moe_align_fused(top_index, e, 16)
    act = silu_mul(grouped_gemm(x, gate_up, align, k, TILES_DECODE, gather_rows=True))
    old_cfg = GroupedConfig(16, TILES_DECODE, TILES_DECODE)
    with torch.inference_mode():
        old = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, old_cfg, residual=residual)
        new = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, DECODE_Q8_0, residual=residual)
        row["new_vs_old_max_abs"] = float((new.float() - old.float()).abs().max())
        row["new_vs_old_rel"] = float((new.float() - old.float()).norm() / old.float().norm())
        row["experts_old_ms"] = _graph_ms(lambda: grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,
                                                                         old_cfg, residual=residual))
        row["experts_new_ms"] = _graph_ms(lambda: grouped_swiglu_experts(x, top_index, top_weight, gate_up, down,
                                                                         DECODE_Q8_0, residual=residual))
        row["old_gate_up_ms"] = _graph_ms(lambda: grouped_gemm(x, gate_up, align, k, TILES_DECODE, gather_rows=True))
        row["old_down_ms"] = _graph_ms(lambda: grouped_gemm(act, down, align, k, TILES_DECODE, gather_rows=False))
        row["old_gate_up_tb_s"] = bytes_gate_up / row["old_gate_up_ms"] / 1e9
        row["old_down_tb_s"] = bytes_down / row["old_down_ms"] / 1e9
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/moe_decode_h200.json")
    ap.add_argument("--tokens", default="16,32,64")
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    for model in args.models.split(","):
        for tokens in map(int, args.tokens.split(",")):
            row = _case(model, tokens, dev)
            rows.append(row)
            print(f"{model:16s} N={tokens:3d} experts={row['experts_used']:3d} align torch/fused "
                  f"{row['align_torch_ms'] * 1e3:.1f}/{row['align_fused_ms'] * 1e3:.1f} us  experts old/new "
                  f"{row['experts_old_ms'] * 1e3:.1f}/{row['experts_new_ms'] * 1e3:.1f} us  old gate_up "
                  f"{row['old_gate_up_tb_s']:.2f} TB/s down {row['old_down_tb_s']:.2f} TB/s  rel diff "
                  f"{row['new_vs_old_rel']:.2e}", flush=True)
    out = {"command": " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
