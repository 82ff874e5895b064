"""Decode groups: how the batcher splits its decoding rows into micro-batches, and the graph buckets
a group's step runs. Pure arithmetic on row counts (no tensors), shared by the batcher's launches and
warm-up's list of the shapes it can launch."""

from __future__ import annotations

import math


def batch_bucket(size: int) -> int:
    """Rows a decode step of ``size`` sequences runs (graph bucket): 1, 2, 4, 8, then multiples of 8."""
    if size <= 8:
        return 1 << max(0, math.ceil(math.log2(max(size, 1))))
    return -(-size // 8) * 8


def plan_groups(count: int, micro_batches: int, graphs: bool, limit: int) -> list[tuple[int, int, int]]:
    """Split ``count`` decoding rows into at most ``micro_batches`` groups ``(first row, sequences, rows
    run)``; with ``graphs`` a group runs a :func:`batch_bucket` of rows (free rows as padding) unless
    that would reach row ``limit``."""
    if count == 0:
        return []
    n = min(micro_batches, count)
    size = -(-count // n)
    if graphs and n > 1:
        size = batch_bucket(size)
    groups = []
    for first in range(0, count, size):
        members = min(size, count - first)
        run = batch_bucket(members) if graphs else members
        if first + run > limit:
            run = members
        groups.append((first, members, run))
    return groups
