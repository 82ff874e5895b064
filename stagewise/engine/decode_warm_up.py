"""Decode warm-up: one step of every decode shape at every attended-length bucket, before the first request.

A decode step replays the CUDA graph of its key ``(first row, rows run, steps, bucket)``
(:class:`~stagewise.runtime.step_graphs.StepGraphs`): the bucket is the attended length rounded up
(:func:`~stagewise.runtime.step_graphs.kv_bucket`), so a burst whose sequences grow past 256, 512,
1,024, ... positions captures a graph (and compiles the decode attention's kernels for its slicing)
at each bucket it reaches, in the middle of serving. Reaching every bucket with real requests would
prefill a sequence of every length; a step needs no sequence: a free row's block table points at the
scratch block (padding rows of a group write there too) and its recurrent state is reset when a
sequence starts in it, so a step of free rows at positions ``bucket - 1`` captures exactly the graph a
sequence at that length replays, and changes nothing a request reads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from stagewise.engine.batcher import Batcher
from stagewise.runtime.step_graphs import kv_buckets

GraphKey = tuple[int, int, int]  # (first row, rows run, attended-length bucket)


def decode_buckets(batcher: Batcher) -> tuple[int, ...]:
    """The attended-length buckets a decode step of ``batcher`` can reach: up to the positions a sequence
    may use (:attr:`Batcher.sequence_tokens`)."""
    return kv_buckets(batcher.sequence_tokens, batcher.max_context)


def graph_keys(shapes: Iterable[tuple[int, int]], buckets: Iterable[int]) -> frozenset[GraphKey]:
    """Every ``(first row, rows run, bucket)`` of decode ``shapes`` ``(first row, rows run)`` and ``buckets``."""
    return frozenset((first, run, bucket) for first, run in shapes for bucket in buckets)


def warm_decode_steps(batcher: Batcher, keys: Iterable[GraphKey]) -> frozenset[GraphKey]:
    """Run one decode step of free rows for each key, its tokens sampled on the exit device (greedy), and
    at each shape's smallest bucket one more with the logits returned (the host's sampler: the graph is
    the same, the exit's reads differ); discard them. Call with no sequence in the batcher (every row
    free). Returns the keys run."""
    if batcher.active:
        raise RuntimeError("decode warm-up runs on free rows: the batcher must be empty")
    done: set[GraphKey] = set()
    for first, run, bucket in sorted(keys, key=lambda key: (key[2], key[0], key[1])):
        tokens = torch.zeros((run, 1), dtype=torch.long)  # (P, 1)
        positions = torch.full((run, 1), bucket - 1, dtype=torch.long)  # (P, 1): the step ends at the bucket
        first_bucket = not any(key[:2] == (first, run) for key in done)
        for greedy in (True, False) if first_bucket else (True,):
            batcher.pipeline.submit(tokens, positions, start=None, first_row=first, greedy=greedy).result()
        done.add((first, run, bucket))
    return frozenset(done)
