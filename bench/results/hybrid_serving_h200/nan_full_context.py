"""One-off (issue 44): where serve's warm-up of Qwen3.6 meets non-finite logits with the prefix cache on.

On an H100 (nan_warmup_h100/): `serve` of random or made Qwen3.6-35B-A3B Q8_0 fails its warm-up with "non-finite
logits" at every --max-seqs, PDL on or off, with or without the shared expert's fold; with --no-prefix-cache it
warms up, and bench/warm_up_check.py (the same warm-up in process, no full-context step) passes. So: the
warm-up, then the load check's full-context step (a 3,584-token prompt that shares the warm-up prompts' first
1,025 tokens: a prefix-cache hit restoring a recurrent-state snapshot), step by step: after each batcher
iteration every state pool and KV pool is scanned for non-finite values, and the first step that leaves one is
printed with its rows, chunks, snapshots and the sequence's restore. Env: MODEL, GRAPHS=0 (no CUDA graphs), PIECES=0
(packed steps eagerly, decode graphs kept),
SNAPS (prefix snapshots; default one a slot), FULL_FIRST=1 (the full-context step before the warm-up: no hit),
SCAN=0 (no scan and no device synchronization between iterations, as serve runs: the pools scanned once at the
first error or the end).

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/nan_full_context.py
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
from stagewise.engine.warm_up import full_context_prompt, warm_up

if os.environ.get("TRITON_INTERPRET") == "1":  # the CPU: the kernels through Triton's interpreter
    from stagewise.kernels.triton_launch import kernels_on_host

    _ON_HOST = kernels_on_host()  # held: a dropped generator context would close (and leave) at once
    _ON_HOST.__enter__()
snaps = os.environ.get("SNAPS")
SCAN = os.environ.get("SCAN", "1") == "1"
m = load_model(os.environ.get("MODEL", "random:qwen3.6-35b-a3b@q8_0"), os.environ.get("DEVICES", "cuda:0"), "single", 4096, max_seqs=8,
               cuda_graphs=os.environ.get("GRAPHS", "1") == "1", prefix_snapshots=None if snaps is None else int(snaps))
if os.environ.get("PIECES") == "0":  # packed steps eagerly, decode steps still replayed as graphs
    for stage in m.pipeline.stages:
        stage.packed = None
b = Batcher(m.pipeline, m.max_context, m.prefill_chunk)
slots = m.pipeline.stages[0].states.slots
V = m.config.vocab_size
print("profile", m.profile, "first snapshot entry", slots.first_snapshot, "entries", slots.entries, flush=True)


def nonfinite() -> dict[str, list[int]]:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    bad = {}
    for i, s in m.pipeline.stages[0].states.blocks.items():
        pools = getattr(s, "pools", None) or {"key": s.key, "value": s.value}
        for name, t in pools.items():
            per = (~torch.isfinite(t.float())).flatten(1).any(1).nonzero().flatten().tolist()
            if per:
                bad[f"{i}.{name}"] = per[:16]
    return bad


def full_context(tag: str) -> None:
    length = full_context_prompt(b)
    prompt = tuple(i % V for i in range(1, length + 1))
    errors: list[str] = []
    seq = Sequence(GenerationRequest(prompt, 1, SamplingParams(temperature=0.0)), lambda _e: True,
                   lambda e: errors.append(str(e)) is None, lambda: False)
    b.add(seq)
    step = 0
    while b.active:
        before = [(f.group, [r.row if r is not None else None for r in f.rows], f.snapshots) for f in b.in_flight]
        b.iterate()
        step += 1
        look = SCAN or bool(errors) or not b.active  # else nothing is read back from the device
        bad = nonfinite() if look else {}
        row = {"run": tag, "iteration": step, "prefilled": seq.prefilled, "shared_tokens": seq.shared_tokens,
               "cached_tokens": seq.cached_tokens, "restored": seq.restored, "row": seq.row,
               "table_row": slots.table[max(seq.row, 0)].tolist() if look else None, "in_flight_before": str(before)[:300],
               "in_flight_after": str([(f.group, f.snapshots) for f in b.in_flight])[:300],
               "errors": errors[:1], "nonfinite": dict(list(bad.items())[:8])}
        print(json.dumps(row), flush=True)
        if bad or errors:
            break
    b.drain()
    store = b.kv.snapshots
    print(json.dumps({"run": tag, "done": True, "errors": errors[:1], "hit_tokens": b.kv.hit_tokens,
                      "snapshots_keyed": len(store) if store else None,
                      "evictions": store.evictions if store else None}), flush=True)


if os.environ.get("FULL_FIRST") == "1":
    full_context("full-context before warm-up")
try:
    done = warm_up(b, V)
    print("warm-up:", done.summary(), flush=True)
except Exception as exc:
    print("warm-up failed:", type(exc).__name__, exc, flush=True)
print("after warm-up, non-finite:", json.dumps(nonfinite()), flush=True)
full_context("full-context after warm-up")
