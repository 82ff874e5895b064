"""The host's share of a step, on a machine without a GPU: what a packed prefill step or a decode step
costs in Python and torch dispatch, the kernels' own execution left out.

A GPU step that is host-bound (issue 44: a 128-token Qwen3.6 packed step took 71-85 ms of wall for
20 ms of kernels on an H200) spends its time where no GPU profile looks: the layers' Python, torch's
dispatch of small ops, the launchers' argument handling. This runs the Triton path on CPU tensors
(Triton's interpreter) and times every kernel launch from the moment the interpreter takes it; the
step's wall time minus that is the host work a GPU step pays too (less Triton's own launch binding,
which the interpreter does not do; that is counted apart, as launches and their arguments).

    TRITON_INTERPRET=1 python bench/host_overhead.py FILE [--prompt 128] [--repeats 5] [--profile N] [--skip-kernels]

Prints, per step kind (a prompt of ``--prompt`` tokens alone; ``--rows`` decode rows), the median wall,
the kernels' time, the rest (host), launches, their arguments and torch ops (a dispatch mode counts
them); ``--profile N`` adds the N functions with the most host time (cProfile, kernels' frames cut).
``--pieces``: the packed step is cut into graph pieces as a GPU stage cuts it (``runtime/packed_graphs.py``;
here a replay runs its piece again) and the pieces' share is reported apart (``pieces``: host ms, launches,
torch ops, replays): on a GPU each piece is one graph replay, so the rest is what the step still pays.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from typing import Any

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1: the kernels run on the CPU through Triton's interpreter")

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.kernels.triton_launch import kernels_on_host
from stagewise.runtime import packed_graphs
from stagewise.runtime.packed_graphs import PackedGraphs
from tests.batch_runs import run_batch


class KernelClock:
    """While open, the time spent inside Triton launches (the interpreter running them), their count,
    their arguments and each kernel's launches; ``paused`` (a cProfile profiler, an op counter) is
    switched off for the launches' duration, so that it sees the host's work only."""

    inside = False  # a launch is running (the op counter ignores the interpreter's own torch calls)

    def __init__(self, paused: cProfile.Profile | None = None, skip: bool = False) -> None:
        self.paused = paused
        self.skip = skip  # launches return at once: the kernels' outputs are left as allocated
        self.seconds = 0.0
        self.launches = 0
        self.arguments = 0
        self.by_kernel: Counter[str] = Counter()
        self._original = InterpretedFunction.run

    def __enter__(self) -> KernelClock:
        original, clock = self._original, self

        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if clock.paused is not None:
                clock.paused.disable()
            KernelClock.inside = True
            start = time.perf_counter()
            try:
                return None if clock.skip else original(kernel, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - start
                KernelClock.inside = False
                if clock.paused is not None:
                    clock.paused.enable()
                clock.launches += 1
                clock.arguments += len(args) + len(kwargs) - 2  # less grid and warmup
                clock.by_kernel[kernel.fn.__name__] += 1

        InterpretedFunction.run = run  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        InterpretedFunction.run = self._original  # type: ignore[method-assign]


class OpCount(TorchDispatchMode):
    """Torch ops dispatched while open (outside the kernels' interpreter, which works in numpy); those
    inside graph pieces (:class:`PieceClock`) apart."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.piece_ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not KernelClock.inside:
            self.ops[str(func.overloadpacket)] += 1
            self.piece_ops += PieceClock.inside
        return func(*args, **(kwargs or {}))


class PieceClock:
    """While open, the host time, launches and replays inside packed steps' graph pieces (a replay off
    CUDA runs its piece again: ``packed_graphs._Rerun``), the kernels' own time left out."""

    inside = False

    def __init__(self, kernels: KernelClock) -> None:
        self.kernels = kernels
        self.seconds = 0.0
        self.launches = 0
        self.replays = 0
        self._original = packed_graphs._Rerun.replay

    def __enter__(self) -> PieceClock:
        original, clock = self._original, self

        def replay(rerun: Any) -> None:
            kernel_s, launches = clock.kernels.seconds, clock.kernels.launches
            PieceClock.inside = True
            start = time.perf_counter()
            try:
                original(rerun)
            finally:
                PieceClock.inside = False
                clock.seconds += time.perf_counter() - start - (clock.kernels.seconds - kernel_s)
                clock.launches += clock.kernels.launches - launches
                clock.replays += 1

        packed_graphs._Rerun.replay = replay  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        packed_graphs._Rerun.replay = self._original  # type: ignore[method-assign]


def _measure(batcher: Batcher, requests: list[GenerationRequest], repeats: int, skip: bool) -> dict[str, Any]:
    walls, kernels, pieces, launches, arguments = [], [], [], 0, 0
    for _ in range(repeats):
        with KernelClock(skip=skip) as clock, PieceClock(clock) as piece:
            start = time.perf_counter()
            run_batch(batcher, requests)
            walls.append(time.perf_counter() - start)
        kernels.append(clock.seconds)
        pieces.append(piece.seconds)
        launches, arguments, by_kernel = clock.launches, clock.arguments, clock.by_kernel
    with KernelClock(skip=skip) as clock, PieceClock(clock) as piece, OpCount() as ops:
        run_batch(batcher, requests)
    host = [w - k for w, k in zip(walls, kernels, strict=True)]
    out = {"wall_ms": round(statistics.median(walls) * 1e3, 1),
           "kernels_ms": round(statistics.median(kernels) * 1e3, 1),
           "host_ms": round(statistics.median(host) * 1e3, 2), "launches": launches, "launch_arguments": arguments,
           "torch_ops": sum(ops.ops.values()), "top_torch_ops": ops.ops.most_common(12),
           "top_kernels": by_kernel.most_common(12)}
    if piece.replays:
        out["pieces"] = {"host_ms": round(statistics.median(pieces) * 1e3, 2), "launches": piece.launches,
                         "torch_ops": ops.piece_ops, "replays": piece.replays}
    return out


def _profile(batcher: Batcher, requests: list[GenerationRequest], top: int, skip: bool) -> list[tuple[str, float, int]]:
    """The ``top`` functions by host time: cProfile's own time per function, paused inside launches."""
    profiler = cProfile.Profile()
    with KernelClock(paused=profiler, skip=skip):
        profiler.enable()
        run_batch(batcher, requests)
        profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_, calls, own, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((f"{os.path.relpath(path) if path.startswith('/') else path}:{line} {name}", own, calls))
    rows.sort(key=lambda r: -r[1])
    return [(label, round(own * 1e3, 2), calls) for label, own, calls in rows[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens of the packed step")
    parser.add_argument("--rows", type=int, default=0, help="also measure 8 decode steps of this many sequences "
                        "(eager here; a GPU replays them as CUDA graphs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, help="print the N functions with the most host time")
    parser.add_argument("--skip-kernels", action="store_true",
                        help="launches return at once (outputs left as allocated: the tokens are garbage, the host's "
                        "work is the same): many repeats in seconds, for A/B of host-side changes")
    parser.add_argument("--pieces", action="store_true", help="cut packed steps into graph pieces (module doc)")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model(args.model, devices="cpu:1x4GiB", placement="single", context=1024, max_seqs=max(args.rows, 1),
                        prefill_chunk=max(args.prompt, 64))
    result: dict[str, Any] = {"model": args.model, "prompt_tokens": args.prompt, "rows": args.rows}
    try:
        if args.pieces:
            for stage in loaded.pipeline.stages:
                assert stage.states is not None
                stage.packed = PackedGraphs(stage.model, stage.states, stage.device, loaded.profile.step_tokens,
                                            stage.dtype)
        batcher = Batcher(loaded.pipeline, loaded.max_context, max(args.prompt, 64), prefix_cache=False)
        greedy = SamplingParams(temperature=0.0)
        prompt = [GenerationRequest(tuple(range(10, 10 + args.prompt)), 1, greedy)]
        decode = [GenerationRequest((5 + i,), 9, greedy) for i in range(args.rows)]  # 1-token prompts, 8 decode steps
        with kernels_on_host():
            run_batch(batcher, prompt)  # first runs: imports, caches
            result["prompt_step"] = _measure(batcher, prompt, args.repeats, args.skip_kernels)
            print(json.dumps(result["prompt_step"]), flush=True)
            if args.profile:
                result["prompt_profile"] = _profile(batcher, prompt, args.profile, args.skip_kernels)
            if args.rows:
                run_batch(batcher, decode)
                result["decode_9_steps"] = _measure(batcher, decode, args.repeats, args.skip_kernels)
    finally:
        loaded.close()
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
