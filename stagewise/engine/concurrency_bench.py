"""Timing of many concurrent requests through the batcher, for ``stagewise bench --concurrency``.

For each level N, N greedy requests (random prompts of the same length, no stop token) are added at
once and run to completion through :class:`Batcher`, as the server would run them. Reported per
level (median over repeats):

- ``aggregate_tokens_per_s``: every generated token over the whole wall time (prefills included);
- ``decode_tokens_per_s``: tokens generated while all N streams were decoding (from the last
  stream's first token to the first stream's last), over that stretch — the decode rate at
  batch N that llama.cpp's ``batched-bench`` reports as S_TG (None if no such stretch);
- ``per_request_tokens_per_s``: median over requests of (tokens - 1) / (last token - first token);
- ``ttft_s`` (median and max): from the moment all requests were added to each one's first token.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.sampling_params import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError


def _sync_all() -> None:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def _raise(error: StagewiseError) -> None:
    raise error


def run_level(batcher: Batcher, prompts: list[tuple[int, ...]], gen_tokens: int) -> dict[str, Any]:
    """Run one greedy request per prompt at once; returns the level's figures and each request's tokens."""
    stamps: list[list[float]] = [[] for _ in prompts]
    tokens: list[list[int]] = [[] for _ in prompts]

    def sink(i: int) -> Any:
        def on_token(event: TokenEvent) -> bool:
            stamps[i].append(time.perf_counter())
            tokens[i].append(event.sample.token)
            return True
        return on_token

    _sync_all()
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        batcher.add(Sequence(GenerationRequest(prompt, gen_tokens, SamplingParams(temperature=0.0)),
                             sink(i), _raise, lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    _sync_all()
    t_end = time.perf_counter()
    all_started = max(s[0] for s in stamps)
    first_done = min(s[-1] for s in stamps)
    steady = sum(1 for s in stamps for t in s if all_started < t <= first_done)
    rates = [(len(s) - 1) / (s[-1] - s[0]) for s in stamps if len(s) > 1 and s[-1] > s[0]]
    ttfts = [s[0] - t0 for s in stamps]
    generated = sum(len(s) for s in stamps)
    return {
        "streams": len(prompts),
        "generated_tokens": generated,
        "wall_s": t_end - t0,
        "aggregate_tokens_per_s": generated / (t_end - t0),
        "decode_tokens_per_s": steady / (first_done - all_started) if first_done > all_started else None,
        "per_request_tokens_per_s": statistics.median(rates) if rates else None,
        "ttft_s_median": statistics.median(ttfts),
        "ttft_s_max": max(ttfts),
        "tokens": tokens,
    }


def bench_concurrency(loaded: LoadedModel, levels: list[int], prompt_tokens: int, gen_tokens: int, repeats: int,
                      micro_batches: int | None = None, prefix_cache: bool = True) -> list[dict[str, Any]]:
    """The figures of :func:`run_level` at each level of ``levels`` (median of ``repeats`` runs after an
    untimed one that compiles kernels and captures graphs); each request's prompt differs. Steps take
    the loaded profile's prefill chunk as their token budget."""
    batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk, micro_batches,
                      prefix_cache=prefix_cache)
    vocab = loaded.config.vocab_size
    out = []
    for level in levels:
        if level > batcher.slots:
            raise ValueError(f"concurrency {level} exceeds the {batcher.slots} sequence slots loaded")
        gen = torch.Generator().manual_seed(level)
        prompts = [tuple(torch.randint(0, vocab, (prompt_tokens,), generator=gen).tolist()) for _ in range(level)]
        run_level(batcher, prompts, gen_tokens)  # untimed: kernels, graphs, allocator
        runs = []
        for _ in range(max(repeats, 1)):
            batcher.kv.clear()  # NOTE: idle; a run must not hit the prompts the previous one cached
            runs.append(run_level(batcher, prompts, gen_tokens))
        best = sorted(runs, key=lambda r: r["aggregate_tokens_per_s"])[len(runs) // 2]
        row = {k: v for k, v in best.items() if k != "tokens"}
        row["aggregate_tokens_per_s_runs"] = [r["aggregate_tokens_per_s"] for r in runs]
        row["micro_batches"] = batcher.micro_batches
        out.append(row)
    return out
