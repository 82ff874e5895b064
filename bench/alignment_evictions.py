"""Issue 44 on the host: which decode graphs would replay an identity alignment the 64-entry LRU cache
(kernels/moe_align.py before the fix) had freed, for call5's workload (warm-up, then 8 / 32 / 64-stream
bursts of chat-like prompts sharing a 64-token head, 128 tokens out, greedy, two passes).

A dense Q8_0 matmul of 17+ rows runs on ``identity_alignment(rows, block_m)``; a decode graph bakes the
addresses of the one cached when it was captured, and its replays call no Python, so they never refresh
it. The script runs the real batcher (tiny-qwen3.6 on the CPU, torch path, decode graphs recorded by
``tests/step_graph_keys.py``), logs the row counts every step's dense matmuls take (a packed step's
tokens, its logit rows; a decode graph's rows at capture), replays them through an LRU of 64, and prints
each burst's graph replays whose alignment had been evicted since their capture.

    .venv/bin/python bench/alignment_evictions.py [--max-seqs 64] [--lru 64]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.engine.warm_up import warm_up
from stagewise.kernels.q8_0_gemm import DECODE_ROWS
from stagewise.weights.quant.q8_0 import GEMV_MAX_TOKENS
from tests.step_graph_keys import record_graph_keys


def alignment_key(rows: int) -> tuple[int, int] | None:
    """The ``(rows, block_m)`` a Q8_0 matmul of ``rows`` rows caches on a CUDA device (q8_0_gemm.py); None: the GEMV."""
    if rows <= GEMV_MAX_TOKENS:
        return None
    if rows <= DECODE_ROWS:
        return rows, max(16, 1 << (rows - 1).bit_length())
    return rows, 128 if rows >= 1024 else 64


class Lru:
    """``functools.lru_cache``'s policy over keys; each insertion a new object (a new allocation)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.made = 0
        self.evictions = 0

    def get(self, key: tuple[int, int]) -> int:
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        self.made += 1
        self.cache[key] = self.made
        if len(self.cache) > self.size:
            self.cache.popitem(last=False)
            self.evictions += 1
        return self.made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-seqs", type=int, default=64)
    parser.add_argument("--lru", type=int, default=64)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=216)
    parser.add_argument("--head", type=int, default=64, help="tokens every prompt shares (the chat template)")
    parser.add_argument("--bursts", default="8,32,64")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    loaded = load_model("random:tiny-qwen3.6", devices="cpu:1x4GiB", placement="single", context=4096,
                        max_seqs=args.max_seqs)
    record_graph_keys(loaded.pipeline)
    batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk)
    lru = Lru(args.lru)
    captured: dict[tuple[int, int], int] = {}  # graph (first row, rows) -> the alignment object it baked
    phase = {"name": "warm-up", "step": 0}
    stale: dict[str, list[dict[str, object]]] = {}
    submit = loaded.pipeline.submit

    def logged(tokens, positions, start=None, all_logits=False, first_row=0, eager=False, greedy=False, layout=None):  # type: ignore[no-untyped-def]
        phase["step"] += 1
        if layout is not None or eager:  # eager: every dense matmul at the step's tokens, the head at its logit rows
            for rows in (layout.tokens, len(layout.logits)) if layout is not None else (int(tokens.shape[0]),):
                key = alignment_key(rows)
                if key is not None:
                    lru.get(key)
        else:
            rows = int(positions.shape[0])
            key = alignment_key(rows)
            graph = (first_row, rows)
            if graph not in captured:  # capture: two eager passes, then the capture, read the cache
                captured[graph] = lru.get(key) if key is not None else 0
            elif key is not None and lru.cache.get(key) != captured[graph]:
                live = sum(1 for s in batcher.decoding if s is not None and not s.done)
                stale.setdefault(phase["name"], []).append(
                    {"step": phase["step"], "graph": graph, "live": live})
        return submit(tokens, positions, start=start, all_logits=all_logits, first_row=first_row, eager=eager,
                      greedy=greedy, layout=layout)

    loaded.pipeline.submit = logged  # type: ignore[method-assign]
    vocab = loaded.config.vocab_size
    warm_up(batcher, vocab)
    print(f"prefill chunk {loaded.prefill_chunk}; after warm-up: {len(lru.cache)} alignments cached, "
          f"{lru.evictions} evicted, {len(captured)} decode graphs")
    rng = random.Random(0)
    head = tuple(rng.randrange(1, vocab) for _ in range(args.head))
    report = []
    for p in range(1, args.passes + 1):
        for n in (int(b) for b in args.bursts.split(",")):
            phase["name"] = f"burst {n} pass {p}"
            before = lru.evictions
            for _ in range(n):
                prompt = head + tuple(rng.randrange(1, vocab) for _ in range(args.prompt - args.head))
                req = GenerationRequest(prompt, args.gen, SamplingParams(temperature=0.0))
                batcher.add(Sequence(req, lambda e: True, lambda e: None, lambda: False))
            while batcher.active:
                batcher.iterate()
            batcher.drain()
            bad = stale.get(phase["name"], [])
            graphs = sorted({tuple(b["graph"]) for b in bad})  # type: ignore[arg-type]
            first = bad[0] if bad else None
            row = {"burst": n, "pass": p, "evictions": lru.evictions - before, "cached": len(lru.cache),
                   "graphs": len(captured),
                   "stale_replays": len(bad), "stale_graphs": graphs, "first_stale": first}
            report.append(row)
            print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"lru": args.lru, "max_seqs": args.max_seqs, "bursts": report}, indent=1))


if __name__ == "__main__":
    main()
