"""One-off (issue 44, session 11): after 729dc19 no row count gives non-finite logits, but nan_rows.py's N one-token
prompts at 17-48 rows decode other tokens than one row alone (56-64 rows the same). Numerics (another kernel's
reduction order on a random model's near-ties) or wrong values? For each N: N copies of one prompt, 8 tokens,
greedy, with log-probabilities; against N = 1: whether every row got the same tokens as row 0, the first step where
row 0 leaves the 1-row tokens, the largest |log-prob difference| of the chosen token over the steps before it, and
the 1-row margin (top-1 minus top-2 log-prob) at that step. Env: GRAPHS=0, COUNTS, MODEL, PROMPT (token count).

    PYTHONPATH=. python3 bench/results/hybrid_serving_h200/rows_logprobs.py
"""
import json
import os
import sys

sys.path.insert(0, ".")
from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence

m = load_model(os.environ.get("MODEL", "random:qwen3.6-35b-a3b@q8_0"), os.environ.get("DEVICE", "cuda:0"), "single", 4096, max_seqs=64,
               cuda_graphs=os.environ.get("GRAPHS", "1") == "1", prefix_snapshots=0)
prompt = tuple(range(1, 1 + int(os.environ.get("PROMPT", "1"))))
ref = None
for n in [int(c) for c in os.environ.get("COUNTS", "1,8,16,17,24,32,48,56,64").split(",")]:
    b = Batcher(m.pipeline, m.max_context, m.prefill_chunk, prefix_cache=False)
    seqs: list[list[tuple[int, float, tuple]]] = [[] for _ in range(n)]
    errors: list[str] = []
    for i in range(n):
        def tally(e, i=i):
            seqs[i].append((e.sample.token, e.sample.logprob, e.sample.top))
            return True
        b.add(Sequence(GenerationRequest(prompt, 8, SamplingParams(temperature=0.0), top_logprobs=2), tally,
                       lambda e: errors.append(str(e)) is None, lambda: False))
    while b.active:
        b.iterate()
    b.drain()
    toks = [[t for t, _, _ in s] for s in seqs]
    ref = ref if ref is not None else seqs[0]
    row0 = seqs[0]
    first = next((k for k, (a, r) in enumerate(zip(row0, ref)) if a[0] != r[0]), None)
    upto = len(row0) if first is None else first + 1
    dlp = max((abs(a[1] - r[1]) for a, r in zip(row0[:upto], ref[:upto]) if a[0] == r[0]), default=0.0)
    margin = None
    if first is not None and len(ref[first][2]) >= 2:
        margin = ref[first][2][0][1] - ref[first][2][1][1]
    print(json.dumps({"rows": n, "rows_unlike_row0": sum(t != toks[0] for t in toks), "errors": len(errors),
                      "first_step_unlike_1row": first, "max_dlogprob_before": round(dlp, 5),
                      "margin_1row_there": None if margin is None else round(margin, 5),
                      "row0": toks[0], "shapes": sorted(b.launched_shapes)}), flush=True)
