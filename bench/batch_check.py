"""Batched vs alone on the GPU: each request's greedy tokens and log-probabilities when it runs with
N-1 others (continuous batching) against the same request run alone, on the same loaded model.

    python3 bench/batch_check.py random:tiny-llama random:tiny-qwen3.6 --streams 8 --gen 32 \
        [--staged cuda:0,cuda:1] [--kv-tokens N] [--json OUT]

Prints, per model: requests whose tokens match alone exactly, the first divergence of the others,
and the largest |log-probability difference| over the tokens both runs share. With ``--staged
DEVICES`` it also loads the model as two stages on DEVICES and runs the same batched schedule
(two micro-batches in flight on both) on the single-device and the staged copy: tokens,
log-probabilities and every KV / recurrent state tensor must be ``torch.equal``. With ``--kv-tokens N``
the KV pool is N positions shared by the streams: too small for all of them, sequences are preempted
and recomputed (the row says how many), and their tokens must still match alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError


def _raise(error: StagewiseError) -> None:
    raise error


def run(batcher: Batcher, prompts: list[tuple[int, ...]], gen: int) -> list[list[tuple[int, float]]]:
    out: list[list[tuple[int, float]]] = [[] for _ in prompts]

    def sink(i: int) -> Any:
        def on_token(event: TokenEvent) -> bool:
            out[i].append((event.sample.token, event.sample.logprob))
            return True
        return on_token

    for i, p in enumerate(prompts):
        batcher.add(Sequence(GenerationRequest(p, gen, SamplingParams(temperature=0.0)), sink(i), _raise,
                             lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    return out


def _states(pipeline: Any) -> dict[tuple[int, str], torch.Tensor]:
    return {(index, name): tensor.cpu() for stage in pipeline.stages for index, state in stage.states.items()
            for name, tensor in state.tensors().items()}


def staged_equal(model: str, prompts: list[tuple[int, ...]], gen: int, devices: str | None, staged: str,
                 context: int, kv_tokens: int | None = None) -> dict[str, Any]:
    """The same batched schedule on one device and on two stages: everything bit-identical?"""
    runs = []
    for spec, placement in ((devices, "single"), (staged, "pipeline:2")):
        loaded = load_model(model, spec, placement, context, max_seqs=len(prompts), kv_tokens=kv_tokens)
        try:
            batcher = Batcher(loaded.pipeline, loaded.max_context, 64, micro_batches=2)
            out = run(batcher, prompts, gen)
            runs.append((out, _states(loaded.pipeline), batcher.preemptions))
        finally:
            loaded.close()
    (a, sa, pa), (b, sb, pb) = runs
    states_equal = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    return {"staged_devices": staged, "staged_tokens_logprobs_equal": a == b,
            "staged_states_equal": states_equal, "state_tensors": len(sa), "staged_preemptions": [pa, pb]}


def check(model: str, streams: int, gen: int, devices: str | None, context: int,
          staged: str | None = None, kv_tokens: int | None = None) -> dict[str, Any]:
    loaded = load_model(model, devices, "single", context, max_seqs=streams, kv_tokens=kv_tokens)
    try:
        batcher = Batcher(loaded.pipeline, loaded.max_context, 64)
        g = torch.Generator().manual_seed(0)
        vocab = loaded.config.vocab_size
        prompts = [tuple(torch.randint(0, vocab, (int(n),), generator=g).tolist())
                   for n in torch.randint(4, 100, (streams,), generator=g)]
        alone = [run(batcher, [p], gen)[0] for p in prompts]
        t0 = time.perf_counter()
        preempted = batcher.preemptions
        together = run(batcher, prompts, gen)
        wall = time.perf_counter() - t0
        preempted = batcher.preemptions - preempted
        exact, first_diff, max_lp = 0, [], 0.0
        for a, b in zip(alone, together, strict=True):
            ta, tb = [t for t, _ in a], [t for t, _ in b]
            if ta == tb:
                exact += 1
            else:
                first_diff.append(next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y))
            shared = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), len(ta))
            for i in range(shared):
                max_lp = max(max_lp, abs(a[i][1] - b[i][1]))
        row = {"model": model, "streams": streams, "gen": gen, "exact_requests": exact,
               "first_divergence": first_diff, "max_abs_logprob_diff": max_lp, "batched_wall_s": wall,
               "kv_tokens": kv_tokens, "preemptions": preempted}
    finally:
        loaded.close()
    if staged:
        row.update(staged_equal(model, prompts, gen, devices, staged, context, kv_tokens))
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--gen", type=int, default=32)
    p.add_argument("--devices", default=None)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--staged", default=None, help="also compare one device with two stages on these devices")
    p.add_argument("--kv-tokens", type=int, default=None, help="KV pool positions (default: every stream its context)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = [check(m, args.streams, args.gen, args.devices, args.context, args.staged, args.kv_tokens)
            for m in args.models]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        meta = {"command": " ".join(["python3", *sys.argv]), "machine": platform.node(),
                "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as fh:
            json.dump({**meta, "results": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
