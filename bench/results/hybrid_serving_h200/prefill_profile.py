"""One-off (issue 44, one H200): where a packed prefill step's time goes. A warm batcher on FILE runs one
prompt of PROMPT tokens (1 token out) REPEATS times; the last one runs under torch.profiler: wall time
per step, the CUDA time summed per kernel (top 30) and the host-side total, as JSON and a table."""
import json, os, sys, time
import torch
from torch.profiler import ProfilerActivity, profile
sys.path.insert(0, ".")
from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from tests.batch_runs import run_batch

path, prompt_tokens = sys.argv[1], int(os.environ.get("PROMPT", 128))
m = load_model(path, "cuda:0", "single", 4096, max_seqs=8)
b = Batcher(m.pipeline, m.max_context, 512, prefix_cache=False)
ids = tuple(range(10, 10 + prompt_tokens))
walls = []
for _ in range(int(os.environ.get("REPEATS", 4))):
    torch.cuda.synchronize(); t = time.perf_counter()
    run_batch(b, [GenerationRequest(ids, 1, SamplingParams(temperature=0.0))])
    torch.cuda.synchronize(); walls.append(time.perf_counter() - t)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    run_batch(b, [GenerationRequest(ids, 1, SamplingParams(temperature=0.0))])
    torch.cuda.synchronize()
rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:30]
table = [{"name": e.key[:90], "calls": e.count, "cuda_ms": round(e.device_time_total / 1e3, 3),
          "cpu_ms": round(e.cpu_time_total / 1e3, 3)} for e in rows]
cuda_ms = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA") / 1e3
out = {"file": path, "prompt_tokens": prompt_tokens, "wall_s": walls, "cuda_kernel_ms_total": round(cuda_ms, 2),
       "top": table}
print(json.dumps({k: v for k, v in out.items() if k != "top"}))
for r in table:
    print(f"{r['cuda_ms']:9.3f} ms {r['calls']:5d}x  {r['name']}")
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), f"prefill_profile_{prompt_tokens}.json"), "w"), indent=1)
