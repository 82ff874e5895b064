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
    """Torch ops dispatched while open (outside the kernels' interpreter, which works in numpy)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not KernelClock.inside:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _measure(batcher: Batcher, requests: list[GenerationRequest], repeats: int, skip: bool) -> dict[str, Any]:
    walls, kernels, launches, arguments = [], [], 0, 0
    for _ in range(repeats):
        with KernelClock(skip=skip) as clock:
            start = time.perf_counter()
            run_batch(batcher, requests)
            walls.append(time.perf_counter() - start)
        kernels.append(clock.seconds)
        launches, arguments, by_kernel = clock.launches, clock.arguments, clock.by_kernel
    with KernelClock(skip=skip), OpCount() as ops:
        run_batch(batcher, requests)
    host = [w - k for w, k in zip(walls, kernels, strict=True)]
    return {"wall_ms": round(statistics.median(walls) * 1e3, 1), "kernels_ms": round(statistics.median(kernels) * 1e3, 1),
            "host_ms": round(statistics.median(host) * 1e3, 2), "launches": launches, "launch_arguments": arguments,
            "torch_ops": sum(ops.ops.values()), "top_torch_ops": ops.ops.most_common(12),
            "top_kernels": by_kernel.most_common(12)}


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
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    loaded = load_model(args.model, devices="cpu:1x4GiB", placement="single", context=1024, max_seqs=max(args.rows, 1),
                        prefill_chunk=max(args.prompt, 64))
    result: dict[str, Any] = {"model": args.model, "prompt_tokens": args.prompt, "rows": args.rows}
    try:
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
