"""One-off (issue 44): which row count's steps give Qwen3.6 Q8_0 non-finite logits (nan_call6: the warm-up's
"N one-token prompts at once" fails at --max-seqs 64 in process, with CUDA_LAUNCH_BLOCKING=1 and without the
prefix cache too). For each N: N one-token prompts, 8 tokens each, through a fresh batcher; prints the tokens
each sequence got before the first error. Env: GRAPHS=0, COUNTS (comma-separated), POISON=1 (every KV pool and
state entry but the zero entry NaN first), NOPAD=1 (decode graphs of exactly the live rows: no padding rows), SCRATCH=1 (every
row's KV block-table entries at the scratch block before the runs, not the identity table a pool covering every
row starts with: padding rows then write nothing a sequence owns).

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/nan_rows.py
"""
import json
import os
import sys

import torch

sys.path.insert(0, ".")
from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence

if os.environ.get("NOPAD") == "1":
    from stagewise.engine import decode_groups

    decode_groups.batch_bucket = lambda size: size  # type: ignore[assignment]
m = load_model(os.environ.get("MODEL", "random:qwen3.6-35b-a3b@q8_0"), "cuda:0", "single", 4096, max_seqs=64,
               cuda_graphs=os.environ.get("GRAPHS", "1") == "1", prefix_snapshots=0)
if os.environ.get("POISON") == "1":  # what no fresh sequence may read: NaN (as tests/test_paged_kv.py's _poison)
    for st in m.pipeline.stages[0].states.blocks.values():
        pools = getattr(st, "pools", None)
        if pools is not None:
            for pool in pools.values():
                pool[1:].fill_(float("nan"))
        else:
            st.key.fill_(float("nan"))
            st.value.fill_(float("nan"))
if os.environ.get("SCRATCH") == "1":
    for stage in m.pipeline.stages:
        if stage.block_table is not None:
            stage.block_table.table.fill_(stage.block_table.scratch)
reference = None
for n in [int(c) for c in os.environ.get("COUNTS", "1,2,8,9,16,17,24,32,33,48,56,63,64").split(",")]:
    b = Batcher(m.pipeline, m.max_context, m.prefill_chunk, prefix_cache=False)
    got: list[int] = [0] * n
    seqs: list[list[int]] = [[] for _ in range(n)]
    errors: list[str] = []
    for i in range(n):
        def tally(e, i=i):
            got[i] += 1
            seqs[i].append(e.sample.token)
            return True
        b.add(Sequence(GenerationRequest((1,), 8, SamplingParams(temperature=0.0)), tally,
                       lambda e: errors.append(str(e)) is None, lambda: False))
    while b.active:
        b.iterate()
    b.drain()
    bad = {}
    if errors:  # which entries of which pools hold non-finite values (state pools; KV pools per block)
        for i, st in m.pipeline.stages[0].states.blocks.items():
            pools = getattr(st, "pools", None) or {"key": st.key, "value": st.value}
            for name, t in pools.items():
                per = (~torch.isfinite(t.float())).flatten(1).any(1).nonzero().flatten().tolist()
                if per:
                    bad[f"{i}.{name}"] = per[:12]
        slots = m.pipeline.stages[0].states.slots
        bad["table"] = slots.table[:n + 8].tolist() if slots is not None else None
        bt = m.pipeline.stages[0].block_table
        bad["blocks"] = bt.table[:n + 8, :2].tolist() if bt is not None else None
    reference = reference if reference is not None else seqs[0]  # the first count's first sequence
    print(json.dumps({"rows": n, "differ": sum(q != reference for q in seqs if len(q) == len(reference)), "errors": len(errors), "first": errors[:1], "tokens": sorted(set(got)),
                      "nonfinite": dict(list(bad.items())[:10]), "shapes": sorted(b.launched_shapes)}), flush=True)
