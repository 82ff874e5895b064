"""The one timing helper of the kernel benchmarks: CUDA-graph replays and eager calls, timed by CUDA events.

Small kernels timed one call at a time measure their launch, not their work: :func:`graph_us`
captures ``calls`` calls in one CUDA graph (as a decode step replays them, dependent launch included)
and times whole replays. ``fn(i)`` may read the ``i``-th of several weight copies, so that the graph
touches more bytes than the L2 holds and every call reads HBM. :func:`eager_ms` times ordinary calls
(launches and host work included: a whole layer or model step). GPU only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def graph_us(fn: Callable[[int], object], calls: int, replays: int = 10) -> float:
    """Median µs per call of ``fn(i)``, ``i = 0 .. calls - 1`` captured in order in one graph, over
    ``replays`` timed replays (after a warm-up on a side stream and one untimed replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(min(calls, 3)):  # compiles and autotunes nothing inside the capture
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def eager_ms(fn: Callable[[], object], warmup: int = 2, iters: int = 10) -> float:
    """Median ms of one ordinary call of ``fn`` (launches and host work included); wall time on a
    machine without CUDA (a CPU smoke run)."""
    for _ in range(warmup):
        fn()
    if not torch.cuda.is_available():
        return statistics.median(_wall_ms(fn) for _ in range(iters))
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _wall_ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, float64)."""
    return float((got.double() - want.double()).norm() / want.double().norm())
