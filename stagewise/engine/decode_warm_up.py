"""Decode warm-up: one step of every decode shape at every attended length its graphs are keyed by, before
the first request.

A decode step replays the CUDA graph of its key ``(first row, rows run, steps, attended length)``
(:class:`~stagewise.runtime.step_graphs.StepGraphs`). Decode attention's Triton kernel reads each row's
length from the positions on the device, so every step of one shape replays one graph captured at the
whole context (:func:`~stagewise.runtime.step_graphs.graph_lengths`: one length): one step per
launchable shape warms them all, whatever the context. On the reference path (``STAGEWISE_KERNELS=torch``)
the attended length is rounded up to a bucket (:func:`~stagewise.runtime.step_graphs.kv_bucket`), a graph
each, so a burst whose sequences grow past 256, 512, 1,024, ... positions would capture one at each
bucket it reaches, in the middle of serving. Reaching a length with real requests would prefill a
sequence that long; a step needs no sequence: a free row's block table points at the scratch block
(padding rows of a group write there too) and its recurrent state is reset when a sequence starts in
it, so a step of free rows at positions ``length - 1`` captures exactly the graph a sequence at that
length replays, and changes nothing a request reads.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from stagewise.engine.batcher import Batcher
from stagewise.runtime.step_graphs import graph_lengths

GraphKey = tuple[int, int, int]  # (first row, rows run, attended length)


def decode_lengths(batcher: Batcher) -> tuple[int, ...]:
    """The attended lengths decode graphs of ``batcher`` are keyed by for sequences of up to the positions
    a sequence may use (:attr:`Batcher.sequence_tokens`): the context alone where one graph serves every
    length, else each bucket."""
    return graph_lengths(batcher.sequence_tokens, batcher.max_context)


def graph_keys(shapes: Iterable[tuple[int, int]], lengths: Iterable[int]) -> frozenset[GraphKey]:
    """Every ``(first row, rows run, length)`` of decode ``shapes`` ``(first row, rows run)`` and ``lengths``."""
    return frozenset((first, run, length) for first, run in shapes for length in lengths)


def warm_decode_steps(batcher: Batcher, keys: Iterable[GraphKey]) -> frozenset[GraphKey]:
    """Run one decode step of free rows for each key, its tokens sampled on the exit device (greedy), and
    at each shape's shortest length one more with the logits returned (the host's sampler: the graph is
    the same, the exit's reads differ); discard them. Call with no sequence in the batcher (every row
    free). Returns the keys run."""
    if batcher.active:
        raise RuntimeError("decode warm-up runs on free rows: the batcher must be empty")
    done: set[GraphKey] = set()
    for first, run, length in sorted(keys, key=lambda key: (key[2], key[0], key[1])):
        tokens = torch.zeros((run, 1), dtype=torch.long)  # (P, 1)
        positions = torch.full((run, 1), length - 1, dtype=torch.long)  # (P, 1): the step ends at the length
        first_length = not any(key[:2] == (first, run) for key in done)
        for greedy in (True, False) if first_length else (True,):
            batcher.pipeline.submit(tokens, positions, start=None, first_row=first, greedy=greedy).result()
        done.add((first, run, length))
    return frozenset(done)
