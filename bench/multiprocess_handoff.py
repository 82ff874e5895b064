"""Handoff time per decode token: torch.distributed between two processes vs the in-process channel.

For each hidden size, one decode token's activation ``(1, 1, H)`` crosses from the first device to
the second (default cuda:0 -> cuda:1):

- ``in_process``: the channel :func:`channel_for` picks inside one process (peer copy on GPUs),
  synchronized on the receiving device;
- ``nccl`` (GPUs) / ``gloo`` (CPUs, or ``--backend gloo``): a :class:`DistributedChannel` between
  two worker processes, header + activation, checked by the receiver; timed as a ping-pong (the
  activation goes and comes back), reported one way (half the round trip).

With ``--model``, also the end-to-end decode step time of that model as a two-stage pipeline in one
process vs two local worker processes (``load_model(..., workers="local")``).

    python bench/multiprocess_handoff.py --out bench/results/multiprocess_handoff.json
    python bench/multiprocess_handoff.py --model random:llama-3.1-8b --out bench/results/multiprocess_handoff.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stagewise.runtime.channel import channel_for
from stagewise.runtime.handoff import Handoff

HIDDEN = (2048, 4096, 8192)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _in_process(src: torch.device, dst: torch.device, hidden: int, iters: int) -> float:
    channel = channel_for(src, dst, None)
    positions = torch.tensor([[100]])
    x = torch.randn(1, 1, hidden, device=src).to(torch.bfloat16)
    times = []
    for i in range(iters + 10):
        _sync(src)
        t0 = time.perf_counter()
        out = channel.send(Handoff(i, positions, x))
        out.check(i, positions, hidden, torch.bfloat16)
        _sync(dst)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[10:])


def _child(args: argparse.Namespace) -> None:
    """One end of the ping-pong (rank 0 hosts the store and sends first); prints JSON."""
    import torch.distributed as dist

    from stagewise.runtime.distributed_channel import DistributedChannel
    from stagewise.runtime.distributed_group import join_group, leave_group, wire_device

    rank = args.rank
    device = torch.device(args.devices.split(",")[rank])
    store = dist.TCPStore("127.0.0.1", args.port, None, rank == 0, datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    join_group(store, 0, rank, 2, args.backend, 60.0, device)
    channel = DistributedChannel(1 - rank, wire_device(args.backend, device), device)
    positions = torch.tensor([[100]])
    out: dict[str, Any] = {}
    for hidden in HIDDEN:
        x = torch.randn(1, 1, hidden, device=device).to(torch.bfloat16)
        times = []
        for i in range(args.iters + 10):
            t0 = time.perf_counter()
            if rank == 0:
                channel.send(Handoff(i, positions, x))
                x = channel.recv(i, positions, hidden, torch.bfloat16).hidden
            else:
                x = channel.recv(i, positions, hidden, torch.bfloat16).hidden
                channel.send(Handoff(i, positions, x))
            _sync(device)
            times.append((time.perf_counter() - t0) / 2)
        out[str(hidden)] = statistics.median(times[10:])
    if rank == 0:
        print(json.dumps(out), flush=True)
    store.set(f"done/{rank}", "1")
    store.wait(["done/0", "done/1"])
    leave_group()


def _distributed(args: argparse.Namespace) -> dict[str, float]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    base = [sys.executable, __file__, "--child", "--port", str(port), "--devices", args.devices,
            "--backend", args.backend, "--iters", str(args.iters)]
    procs = [subprocess.Popen([*base, "--rank", str(r)], env=env, stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"ping-pong workers failed: {[p.returncode for p in procs]}")
    return {k: float(v) for k, v in json.loads(outs[0].strip().splitlines()[-1]).items()}


def _decode_step_s(model: str, devices: str, workers: str | None, steps: int) -> float:
    from stagewise.engine.model_loading import load_model

    loaded = load_model(model, devices=devices, placement="pipeline:2", context=1024, workers=workers)
    try:
        pipe = loaded.pipeline
        pipe.reset(0)
        prompt = torch.arange(16)[None] % loaded.config.vocab_size
        out = pipe.step(prompt, torch.arange(16)[None], start=0)
        times = []
        for pos in range(16, 16 + steps):
            assert out.logits is not None
            token = out.logits[:, -1:].argmax(-1).cpu()
            t0 = time.perf_counter()
            out = pipe.step(token, torch.tensor([[pos]]), start=pos)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[5:])
    finally:
        loaded.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cuda:0,cuda:1", help="the two devices, comma separated")
    parser.add_argument("--backend", default="", help="nccl | gloo (default: nccl on GPUs, else gloo)")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--model", default="", help="also time decode steps end to end (e.g. random:llama-3.1-8b)")
    parser.add_argument("--out", default="bench/results/multiprocess_handoff.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    src, dst = (torch.device(d) for d in args.devices.split(","))
    args.backend = args.backend or ("nccl" if src.type == dst.type == "cuda" else "gloo")
    if args.child:
        _child(args)
        return
    remote = _distributed(args)
    rows = []
    print(f"{'hidden':>7} {'in-process us':>14} {args.backend + ' 2-proc us':>16} {'ratio':>7}")
    for hidden in HIDDEN:
        local = _in_process(src, dst, hidden, args.iters)
        r = remote[str(hidden)]
        rows.append({"hidden": hidden, "bytes": hidden * 2, "in_process_s": local, f"{args.backend}_s": r,
                     "ratio_distributed_over_in_process": r / local})
        print(f"{hidden:>7} {local * 1e6:>14.1f} {r * 1e6:>16.1f} {r / local:>7.2f}")
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "torch": torch.__version__,
                    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]},
        "devices": args.devices, "backend": args.backend, "iters": args.iters, "handoff_per_decode_token": rows,
    }
    if args.model:
        one = _decode_step_s(args.model, args.devices, None, 50)
        two = _decode_step_s(args.model, args.devices, "local", 50)
        result["decode_step"] = {"model": args.model, "in_process_s": one, "two_workers_s": two,
                                 "ratio_workers_over_in_process": two / one}
        print(f"decode step {args.model}: in-process {one * 1e3:.2f} ms, two workers {two * 1e3:.2f} ms "
              f"({two / one:.2f}x)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
