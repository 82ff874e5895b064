"""One-off (issue 44, one H200): bursts of 8/32/64 chat-like requests twice through the batcher on random
Qwen3.6 Q8_0, as serve_load sends them; after each burst, which requests failed and where non-finite
values sit (state entries: zero / rows' / snapshots; KV pools). Variants: prefix cache on, off, and no
CUDA graphs."""
import json, os, random, sys, time
import torch
sys.path.insert(0, ".")
from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from tests.batch_runs import run_batch

G = SamplingParams(temperature=0.0)
m = load_model(os.environ.get("MODEL", "random:qwen3.6-35b-a3b@q8_0"), os.environ.get("DEVICES", "cuda:0"), "single", 4096, max_seqs=64)
slots = m.pipeline.stages[0].states.slots
rng = random.Random(0)
V = m.config.vocab_size
words = [rng.randrange(3, min(V, 30000)) for _ in range(10)]
head = [rng.randrange(3, min(V, 30000)) for _ in range(int(os.environ.get("HEAD", 8)))]  # shared by every prompt


def prompt():
    return tuple(head + [rng.choice(words) for _ in range(208)])


def nonfinite():
    st = m.pipeline.stages[0].states
    bad = {}
    for i, s in st.blocks.items():
        pools = getattr(s, "pools", None) or {"key": s.key, "value": s.value}
        for name, t in pools.items():
            per = (~torch.isfinite(t.float())).flatten(1).any(1).nonzero().flatten().tolist()
            if per:
                bad[f"{i}.{name}"] = per[:12]
    return bad


report = []
for variant in os.environ.get("VARIANTS", "cache,nocache").split(","):
    if variant == "nographs":
        for s in m.pipeline.stages:
            s.graphs = None
    b = Batcher(m.pipeline, m.max_context, 512, prefix_cache=variant == "cache")
    for p in range(int(os.environ.get("PASSES", 2))):
        for n in (8, 32, 64):
            reqs = [GenerationRequest(prompt(), int(os.environ.get("GEN", 128)), G) for _ in range(n)]
            t = time.time()
            out, errs = run_batch(b, reqs)
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            failed = [i for i, e in enumerate(errs) if e is not None]
            bad = nonfinite()
            row = {"variant": variant, "pass": p + 1, "n": n, "s": round(time.time() - t, 2), "failed": len(failed),
                   "first_error": str(errs[failed[0]])[:120] if failed else None,
                   "nonfinite": dict(list(bad.items())[:6]), "first_snapshot": slots.first_snapshot,
                   "snap_evictions": b.kv.snapshots.evictions if b.kv.snapshots else None}
            print(json.dumps(row), flush=True)
            report.append(row)
            if failed and variant == "cache":
                bad_rows = sorted({r for r in range(slots.rows)} )
                print("entries:", slots.published_entries()[:70], flush=True)
            if bad:
                for s in m.pipeline.stages[0].states.blocks.values():  # clean for the next variant
                    for t in (getattr(s, "pools", None) or {"k": s.key, "v": s.value}).values():
                        t.nan_to_num_(0.0, 0.0, 0.0)
json.dump(report, open(os.path.join(os.environ.get("OUT", "/tmp"), "nan_probe_h200.json"), "w"), indent=1)
