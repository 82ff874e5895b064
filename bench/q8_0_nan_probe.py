"""Probe: where do non-finite values first appear when a Q8_0 MoE model decodes on the GPU?

Loads a random Q8_0 model (weights drawn on the device) eagerly, runs a prefill and decode steps,
and reports the first module whose output is not finite (forward hooks), plus each Q8_0 matmul
path checked against its dequantized reference on the same inputs.

    python bench/q8_0_nan_probe.py random:qwen3-30b-a3b@q8_0
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model


def main() -> int:
    model = sys.argv[1] if len(sys.argv) > 1 else "random:qwen3-30b-a3b@q8_0"
    loaded = load_model(model, devices="cuda:0", placement="single", context=256, dtype="bfloat16",
                        cuda_graphs=False)
    stage = loaded.pipeline.stages[0]
    bad: list[str] = []

    def hook(name: str):  # type: ignore[no-untyped-def]
        def fn(_m, _i, out):  # type: ignore[no-untyped-def]
            t = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
            if isinstance(t, torch.Tensor) and not bad and not torch.isfinite(t).all():
                bad.append(f"{name} shape={tuple(t.shape)} max={t.float().abs().nan_to_num(0, 0, 0).max().item():.3g}")
        return fn

    for name, module in stage.model.named_modules():
        if name:
            module.register_forward_hook(hook(name))
    pipe = loaded.pipeline
    pipe.reset(0)
    out = pipe.step(torch.arange(1, 33)[None], torch.arange(32)[None], start=0)
    print("prefill finite:", bool(torch.isfinite(out.logits).all()), "first bad:", bad[:1], flush=True)
    for i in range(3):
        bad.clear()
        out = pipe.step(torch.tensor([[5]]), torch.tensor([[32 + i]]), start=32 + i)
        print(f"decode {i} finite:", bool(torch.isfinite(out.logits).all()), "first bad:", bad[:1], flush=True)
    # each packed weight's GEMV against its dequantized reference
    from stagewise.weights.quant.q8_0 import Q8_0Weight

    checked = 0
    for name, module in stage.model.named_modules():
        for qw in getattr(module, "quantized_weights", lambda: [])():
            if not isinstance(qw, Q8_0Weight) or checked >= 6:
                continue
            k = qw.shape[-1]
            for m in (1, 8):
                x = torch.randn(m, k, device=qw.qs.device, dtype=torch.bfloat16)
                if qw.qs.dim() == 2:
                    y = qw.matmul(x)
                    ref = x.float() @ qw.dequantize(torch.float32).T
                else:
                    idx = torch.arange(m, device=x.device) % qw.shape[0]
                    y = qw.gather_matmul(idx, x)
                    ref = torch.stack([x[i].float() @ qw.expert(int(e)).dequantize(torch.float32).T
                                       for i, e in enumerate(idx.tolist())])
                rel = float((y.float() - ref).norm() / ref.norm())
                print(f"{name} {tuple(qw.shape)} m={m} finite={bool(torch.isfinite(y).all())} rel={rel:.2e}", flush=True)
            checked += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
