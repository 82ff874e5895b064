import subprocess, sys, torch
from stagewise.engine.model_loading import load_model
for dev in ("cuda", "cpu"):
    subprocess.run([sys.executable, "-m", "stagewise", "make-model", "--config", "bench/q36mini_config.json", "--format", "gguf", "--dtype", "q8_0", "--seed", "0", "--device", dev, f"/tmp/mini_{dev}.gguf"], check=True)
def trace(path, devices):
    l = load_model(path, devices=devices, placement="single", context=600, dtype="bfloat16", cuda_graphs=False)
    p = l.pipeline; p.reset(0)
    out = p.step(torch.arange(1, 513)[None] % 4000, torch.arange(512)[None], start=0)
    r = [bool(torch.isfinite(out.logits).all())]
    for i in range(2):
        out = p.step(torch.tensor([[5]]), torch.tensor([[512 + i]]), start=512 + i); r.append(bool(torch.isfinite(out.logits).all()))
    emb = l.pipeline.stages[0].model.model.embed_tokens.weight
    print(path, devices, "finite", r, "emb finite", bool(torch.isfinite(emb).all()), flush=True)
    for n, prm in l.pipeline.stages[0].model.named_parameters():
        if not torch.isfinite(prm).all(): print("  non-finite param", n, flush=True); break
    l.close()
trace("/tmp/mini_cuda.gguf", "cuda:0"); trace("/tmp/mini_cpu.gguf", "cuda:0"); trace("/tmp/mini_cuda.gguf", "cpu:1x40GiB")
