"""Per-step cost of the worker protocol: a tiny model decoding one sequence through one local worker
(``--workers local``, one stage) against the same steps in process, with the coordinator's time split
by control-plane operation (send: seal and queue a command; wait: block until its acknowledgements;
expect / acks / forget: the bookkeeping around them).

``--floor``: also the round trip of one sealed run and its acknowledgement between two processes whose
"worker" spends the measured worker step busy before it answers, once over the project's planes
(:class:`CoordinatorPlane` / :class:`WorkerPlane`) and once over a bare ZeroMQ ROUTER/DEALER pair
with blocking receives on both ends (no threads, no locks): what this machine's scheduler and ZeroMQ's
I/O threads cost a step whatever the protocol above them does.

    python3 bench/worker_protocol.py [--model random:tiny-qwen3] [--steps 300] [--floor] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.engine.model_loading import load_model
from stagewise.runtime.coordinator_plane import CoordinatorPlane
from stagewise.runtime.executor import Executor
from stagewise.runtime.message_seal import MessageSeal
from stagewise.runtime.worker_messages import Ack, Down, Exit, JoinReport, Run, Up
from stagewise.runtime.worker_plane import WorkerPlane

_SECRET, _SESSION, _INCARNATION = b"floor" * 8, "0" * 32, "1" * 32


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


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _answer(seq: int) -> Ack:
    return Ack(seq=seq, rank=1, incarnation=_INCARNATION, ok=True, stage_s=[0.001], pairs=[(5.0, -1.0)])


def _run(seq: int) -> Run:
    return Run(seq=seq, members={1: _INCARNATION}, step_id=seq + 1, tokens=[[5]], positions=[[seq]], greedy=True)


def _plane_worker(port: int, busy_s: float) -> None:
    plane = WorkerPlane("127.0.0.1", port, _SECRET, _SESSION, 1, _INCARNATION)
    plane.send(JoinReport(rank=1, incarnation=_INCARNATION, pid=os.getpid(), host="floor", topology={}))
    while isinstance(cmd := plane.receive(), Run):
        _busy(busy_s)
        plane.send(_answer(cmd.seq))
    plane.close()


def _bare_worker(port: int, busy_s: float) -> None:
    import zmq

    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    down: MessageSeal[Down] = MessageSeal(_SECRET, _SESSION, Down, "floor worker")
    up: MessageSeal[Up] = MessageSeal(_SECRET, _SESSION, Up, "floor worker")
    sock.send(b"hello")
    while isinstance(cmd := down.open(sock.recv()), Run):
        _busy(busy_s)
        sock.send(up.seal(_answer(cmd.seq)))
    sock.close(linger=1000)


def _floor(busy_s: float, steps: int) -> dict[str, float]:
    """Median round trip (ms, the worker's busy time taken off) of a run and its acknowledgement: over
    the project's planes, and over bare ZeroMQ sockets with blocking receives."""
    import zmq

    spawn = multiprocessing.get_context("spawn")
    out: dict[str, float] = {}
    plane = CoordinatorPlane("127.0.0.1", _SECRET, _SESSION)
    worker = spawn.Process(target=_plane_worker, args=(plane.port, busy_s))
    worker.start()
    plane.wait(lambda: 1 in plane.joins, 60)
    times = []
    for seq in range(steps):
        t0 = time.perf_counter()
        plane.expect(seq, {1: _INCARNATION})
        plane.send([(1, _INCARNATION)], _run(seq))
        plane.wait(lambda seq=seq: 1 in plane.acks(seq), 30)  # type: ignore[misc]
        plane.forget(seq)
        times.append(time.perf_counter() - t0 - busy_s)
    plane.send([(1, _INCARNATION)], Exit(seq=steps, members={1: _INCARNATION}))
    worker.join(30)
    plane.close()
    out["planes_ms"] = statistics.median(times) * 1e3

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    down: MessageSeal[Down] = MessageSeal(_SECRET, _SESSION, Down, "floor")
    up: MessageSeal[Up] = MessageSeal(_SECRET, _SESSION, Up, "floor")
    worker = spawn.Process(target=_bare_worker, args=(port, busy_s))
    worker.start()
    who, _ = router.recv_multipart()
    times = []
    for seq in range(steps):
        t0 = time.perf_counter()
        router.send_multipart([who, down.seal(_run(seq))])
        up.open(router.recv_multipart()[1])
        times.append(time.perf_counter() - t0 - busy_s)
    router.send_multipart([who, down.seal(Exit(seq=steps, members={1: _INCARNATION}))])
    worker.join(30)
    router.close(linger=1000)
    ctx.term()
    out["bare_zeromq_ms"] = statistics.median(times) * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny-qwen3")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--floor", action="store_true", help="also the bare round trip (module doc)")
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
    if args.floor:  # the worker busy for as long as the in-process step
        row["round_trip_ms"] = {"worker_busy_ms": in_process_median_s * 1e3,
                                **_floor(in_process_median_s, args.steps), "idle_worker": _floor(0.0, args.steps)}
    print(json.dumps(row, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
