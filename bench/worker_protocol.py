"""Per-step cost of the worker protocol: a tiny model decoding one sequence through one local worker
(``--workers local``, one stage) against the same steps in process, with the coordinator's time split
by control-plane operation (send: seal and queue a command; wait: block until its acknowledgements;
expect / acks / forget: the bookkeeping around them).

    python3 bench/worker_protocol.py [--model random:tiny-qwen3] [--steps 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model
from stagewise.runtime.executor import Executor


def _time_steps(pipeline: Executor, steps: int) -> tuple[float, float, float]:
    """(mean, median, 10th percentile) seconds of one greedy decode step; on a shared machine the
    median and the 10th percentile resist other processes' bursts."""
    pipeline.reset(0)
    pipeline.step(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], start=0)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        pipeline.submit(torch.tensor([[5]]), torch.tensor([[3 + i]]), start=None, greedy=True).result()
        times.append(time.perf_counter() - t0)
    return sum(times) / steps, statistics.median(times), statistics.quantiles(times, n=10)[0]


def _wrap(obj: Any, name: str, spent: dict[str, float]) -> None:
    inner: Callable[..., Any] = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0

    setattr(obj, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny-qwen3")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    common = dict(devices="cpu:1x1GiB", placement="single", context=args.steps + 16)
    local = load_model(args.model, **common)  # type: ignore[arg-type]
    in_process_s, in_process_median_s, in_process_p10_s = _time_steps(local.pipeline, args.steps)
    local.close()
    remote = load_model(args.model, workers="local", worker_timeout_s=30, **common)  # type: ignore[arg-type]
    spent: dict[str, float] = collections.defaultdict(float)
    for name in ("send", "wait", "expect", "acks", "forget"):
        _wrap(remote.pipeline.pool.plane, name, spent)
    try:
        worker_s, worker_median_s, worker_p10_s = _time_steps(remote.pipeline, args.steps)
    finally:
        remote.close()
    row = {"command": " ".join(["python3", *sys.argv]), "model": args.model, "steps": args.steps,
           "in_process_ms": in_process_s * 1e3, "worker_ms": worker_s * 1e3,
           "in_process_median_ms": in_process_median_s * 1e3, "worker_median_ms": worker_median_s * 1e3,
           "in_process_p10_ms": in_process_p10_s * 1e3, "worker_p10_ms": worker_p10_s * 1e3,
           "coordinator_plane_ms_per_step": {k: v / args.steps * 1e3 for k, v in sorted(spent.items())}}
    print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
