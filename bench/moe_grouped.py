"""MoE prefill on the GPU: the per-expert loop of ``Experts`` vs the grouped Triton GEMM path.

For the Qwen3-30B-A3B (E=128, K=8, H=2048, I=768) and Qwen3.6-35B-A3B (E=256, K=8, H=2048, I=512)
expert geometries, random weights (Q8_0 and bf16) and random softmax top-K routing, times one MoE
layer's experts at 512 and 2048 tokens both ways (CUDA events, warm-up, median), reports the max
abs / relative difference of the grouped output against the loop, checks that the grouped path
never synchronizes with the host and that its CUDA-graph replay equals the eager call, prints a
table and writes JSON. ``--sweep`` also times a few tile configs per case (for choosing defaults).

    PYTHONPATH=. python3 bench/moe_grouped.py --out bench/results/moe_grouped_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stagewise.models.layers.experts as experts_module
from bench.kernel_timing import eager_ms
from stagewise.kernels.moe_experts import default_config, grouped_swiglu_experts
from stagewise.kernels.moe_grouped_triton import GemmTiles, GroupedConfig
from stagewise.models.layers.experts import Experts
from stagewise.weights.quant.q8_0 import Q8_0Weight

MODELS = {"qwen3-30b-a3b": (128, 8, 2048, 768), "qwen3.6-35b-a3b": (256, 8, 2048, 512)}  # E, K, H, I
TOKENS = (512, 2048)
FORMATS = ("q8_0", "bf16")
_T = GemmTiles
DECODE_SWEEP = [  # few slots per expert (batched decode): small row blocks
    GroupedConfig(64, _T(128, 128, 8, 3), _T(128, 64, 4, 4)),
    GroupedConfig(16, _T(64, 128, 4, 4), _T(64, 128, 4, 4)),
    GroupedConfig(16, _T(128, 128, 4, 4), _T(128, 128, 4, 4)),
    GroupedConfig(16, _T(64, 256, 4, 3), _T(64, 256, 4, 3)),
    GroupedConfig(16, _T(32, 256, 4, 4), _T(32, 256, 4, 4)),
    GroupedConfig(16, _T(64, 128, 2, 4), _T(64, 128, 2, 4)),
    GroupedConfig(16, _T(128, 256, 8, 3), _T(128, 256, 8, 3)),
    GroupedConfig(32, _T(64, 128, 4, 4), _T(64, 128, 4, 4)),
]
SWEEP = [  # (block_m, gate_up tiles, down tiles)
    GroupedConfig(64, _T(128, 64, 4, 4), _T(128, 64, 4, 4)),
    GroupedConfig(64, _T(128, 128, 8, 3), _T(128, 128, 8, 3)),
    GroupedConfig(64, _T(128, 128, 8, 3), _T(128, 64, 4, 4)),
    GroupedConfig(64, _T(128, 128, 4, 3), _T(128, 128, 4, 3)),
    GroupedConfig(64, _T(64, 128, 4, 4), _T(64, 128, 4, 4)),
    GroupedConfig(128, _T(128, 64, 8, 3), _T(128, 64, 8, 3)),
    GroupedConfig(128, _T(128, 128, 8, 3), _T(128, 128, 8, 3)),
    GroupedConfig(128, _T(256, 64, 8, 3), _T(256, 64, 8, 3)),
]


def _quantize(w: torch.Tensor) -> Q8_0Weight:
    blocks = w.float().unflatten(-1, (-1, 32))
    scale = (blocks.abs().amax(-1).clamp(min=1e-8) / 127.0).to(torch.float16)
    qs = torch.round(blocks / scale.float()[..., None]).clamp(-127, 127).to(torch.int8).flatten(-2)
    return Q8_0Weight(qs.contiguous(), scale.contiguous())


def _make_experts(e: int, h: int, i: int, fmt: str, dev: torch.device) -> Experts:
    torch.manual_seed(0)
    ex = Experts(e, h, i).to(dev, torch.bfloat16)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(ex, name)
            param.copy_(torch.randn(param.shape, device=dev) * 0.02)
            if fmt == "q8_0":
                ex.set_quantized_param(name, _quantize(param))
    return ex


def _weights(ex: Experts) -> tuple[torch.Tensor | Q8_0Weight, torch.Tensor | Q8_0Weight]:
    gate_up, down = ex._grouped_weight("gate_up_proj"), ex._grouped_weight("down_proj")
    assert gate_up is not None and down is not None
    return gate_up, down


def _case(ex: Experts, tokens: int, k: int, dev: torch.device, sweep: bool) -> dict[str, Any]:
    gen = torch.Generator(device=dev).manual_seed(tokens)
    x = torch.randn(tokens, ex.hidden_size, device=dev, generator=gen).to(torch.bfloat16)
    logits = torch.randn(tokens, ex.num_experts, device=dev, generator=gen) * 2.0
    top_weight, top_index = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    top_weight = (top_weight / top_weight.sum(-1, keepdim=True)).to(torch.bfloat16)
    gate_up, down = _weights(ex)
    with torch.inference_mode():
        real = experts_module.use_triton
        experts_module.use_triton = lambda t: False  # the old path: one matmul pair per used expert
        try:
            loop = ex(x, top_index, top_weight)
            loop_ms = eager_ms(lambda: ex(x, top_index, top_weight), warmup=2, iters=5)
        finally:
            experts_module.use_triton = real
        got = ex(x, top_index, top_weight)  # Experts.forward on the Triton path: the grouped GEMM
        grouped_ms = eager_ms(lambda: ex(x, top_index, top_weight), warmup=3, iters=20)
        again = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside raises
        try:
            grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)
            no_sync = True
        except RuntimeError:
            no_sync = False
        finally:
            torch.cuda.set_sync_debug_mode("default")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)  # warm inside the side stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = grouped_swiglu_experts(x, top_index, top_weight, gate_up, down)
        graph.replay()
        torch.cuda.synchronize()
        row: dict[str, Any] = {
            "tokens": tokens, "loop_ms": loop_ms, "grouped_ms": grouped_ms, "speedup": loop_ms / grouped_ms,
            "max_abs_diff": float((got.float() - loop.float()).abs().max()),
            "rel_diff": float((got.float() - loop.float()).norm() / loop.float().norm()),
            "deterministic": bool(torch.equal(got, again)), "no_host_sync": no_sync,
            "graph_replay_equal": bool(torch.equal(captured, got)),
            "config": repr(default_config(top_index.numel(), ex.num_experts, dev, isinstance(gate_up, Q8_0Weight))),
        }
        if sweep:
            row["sweep_ms"] = {}
            for cfg in (DECODE_SWEEP if tokens <= 128 else SWEEP):
                fn = lambda cfg=cfg: grouped_swiglu_experts(x, top_index, top_weight, gate_up, down, cfg)  # noqa: E731
                row["sweep_ms"][repr(cfg)] = eager_ms(fn, warmup=2, iters=10)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/moe_grouped_h200.json")
    ap.add_argument("--sweep", action="store_true", help="also time a few tile configs per case")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts (default 512,2048)")
    ap.add_argument("--models", default=",".join(MODELS), help="expert geometries")
    ap.add_argument("--formats", default=",".join(FORMATS))
    args = ap.parse_args()
    dev = torch.device("cuda:0")
    started = time.perf_counter()
    rows = []
    print(f"{'model':16s} {'fmt':5s} {'tokens':>6s} {'loop ms':>9s} {'grouped ms':>10s} {'speedup':>8s} "
          f"{'max|diff|':>10s} {'rel diff':>9s} det sync graph")
    for model in args.models.split(","):
        e, k, h, i = MODELS[model]
        for fmt in args.formats.split(","):
            ex = _make_experts(e, h, i, fmt, dev)
            for tokens in map(int, args.tokens.split(",")):
                row = {"model": model, "format": fmt, "E": e, "K": k, "H": h, "I": i,
                       **_case(ex, tokens, k, dev, args.sweep)}
                rows.append(row)
                print(f"{model:16s} {fmt:5s} {tokens:6d} {row['loop_ms']:9.2f} {row['grouped_ms']:10.3f} "
                      f"{row['speedup']:7.1f}x {row['max_abs_diff']:10.2e} {row['rel_diff']:9.2e} "
                      f"{'ok' if row['deterministic'] else 'NO':>3s} {'ok' if row['no_host_sync'] else 'NO':>4s} "
                      f"{'ok' if row['graph_replay_equal'] else 'NO':>5s}", flush=True)
                if args.sweep:
                    for cfg, ms in sorted(row["sweep_ms"].items(), key=lambda kv: kv[1]):
                        print(f"    {ms:8.3f} ms  {cfg}")
            del ex
            torch.cuda.empty_cache()
    out = {"command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now(datetime.UTC).isoformat(),
           "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "seconds": time.perf_counter() - started, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} ({out['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
