"""Warm-up check on a device: after warm-up, does serving still compile Triton kernels or capture CUDA graphs?

    python bench/warm_up_check.py MODEL [--devices cuda:0] [--placement single] [--context 16384]
        [--max-seqs 64] [--prefill-chunk N] [--kv-tokens N] [--bursts 8,32,64] [--prompt 208] [--gen 128] [--json OUT]

Loads MODEL in process, runs :func:`stagewise.engine.warm_up.warm_up` (as ``serve`` does before ready) and
counts the kernels Triton's caches hold (:func:`~stagewise.kernels.kernel_variants.compiled_variants`), the
device allocations the caching allocator made (``cudaMalloc`` calls: a burst growing the pool) and
the graphs every stage captured (decode steps, packed steps' pieces); then, for each burst size, that
many greedy requests of ``--prompt`` tokens and ``--gen`` out at once, followed by a mixed burst (random
prompt lengths up to the context, random lengths out, a third sampled on the host with
log-probabilities), and reports the kernels
compiled and graphs captured during each (the target: none) and its wall time. A table is printed; JSON
(command, machine, date, figures) goes to ``--json``. ``--host-profile N``: each burst also runs under
cProfile, and the N functions whose own host time grew most from one burst to the next are printed
(what a first burst pays that a later one does not, where nothing compiles or captures).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.engine.warm_up import warm_up
from stagewise.errors import StagewiseError
from stagewise.kernels.kernel_variants import compiled_variants


def _raise(error: StagewiseError) -> None:
    raise error


def _graphs(batcher: Batcher) -> int:
    """Graphs the stages hold: decode graphs, and packed steps' pieces (one per block and one more, a bucket)."""
    stages = batcher.pipeline.stages
    decode = sum(len(stage.graphs.graphs) for stage in stages if getattr(stage, "graphs", None))
    pieces = sum(len(p) for stage in stages if getattr(stage, "packed", None) for p in stage.packed.graphs.values())
    return decode + pieces


def _device_allocs() -> int | None:
    """``cudaMalloc`` calls the caching allocator has made so far (None off CUDA): a burst that makes any grows the
    device pool, a first-use cost that neither a compile nor a capture counts."""
    return int(torch.cuda.memory_stats().get("num_device_alloc", 0)) if torch.cuda.is_available() else None


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def _serve(batcher: Batcher, requests: list[GenerationRequest],
           profile: cProfile.Profile | None = None) -> tuple[int, float]:
    produced: list[int] = []
    t0 = time.perf_counter()
    if profile is not None:
        profile.enable()
    for req in requests:
        batcher.add(Sequence(req, lambda e: produced.append(1) is None, _raise, lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if profile is not None:
        profile.disable()
    return len(produced), time.perf_counter() - t0


def _own_seconds(profile: cProfile.Profile) -> dict[str, float]:
    """Each function's own time (not its callees'), by ``file:line(name)``."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return {f"{Path(f).name}:{line}({name})": tt for (f, line, name), (_, _, tt, _, _) in stats.items()}


def _first_burst_extra(before: dict[str, float], after: dict[str, float], top: int) -> list[tuple[str, float, float]]:
    """The ``top`` functions whose own time fell most from ``before`` (a first burst) to ``after``."""
    names = sorted(before, key=lambda k: after.get(k, 0.0) - before[k])[:top]
    return [(k, before[k], after.get(k, 0.0)) for k in names]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--devices", default="cuda:0")
    p.add_argument("--placement", default="single")
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--max-seqs", type=int, default=64)
    p.add_argument("--prefill-chunk", type=int, default=None)
    p.add_argument("--kv-tokens", type=int, default=None, help="serve's --kv-tokens (a pool smaller than every row's context)")
    p.add_argument("--bursts", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 64])
    p.add_argument("--prompt", type=int, default=208)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--host-profile", type=int, default=0, metavar="N")
    args = p.parse_args()
    loaded = load_model(args.model, args.devices, args.placement, args.context, max_seqs=args.max_seqs,
                        prefill_chunk=args.prefill_chunk, kv_tokens=args.kv_tokens)
    batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk)
    vocab = loaded.config.vocab_size
    rng = random.Random(args.seed)
    rows = []
    kernels, graphs, allocs = compiled_variants(), _graphs(batcher), _device_allocs()
    done = warm_up(batcher, vocab)
    print(f"stagewise: {done.summary()}")
    rows.append({"run": "warm-up", "seconds": done.seconds, "kernels_compiled": compiled_variants() - kernels,
                 "graphs_captured": _graphs(batcher) - graphs, "device_allocs": _delta(_device_allocs(), allocs),
                 "tokens": done.generated_tokens})

    profiles: list[dict[str, float]] = []

    def measure(name: str, requests: list[GenerationRequest]) -> None:
        k0, g0, a0 = compiled_variants(), _graphs(batcher), _device_allocs()
        profile = cProfile.Profile() if args.host_profile else None
        tokens, seconds = _serve(batcher, requests, profile)
        rows.append({"run": name, "seconds": seconds, "kernels_compiled": compiled_variants() - k0,
                     "graphs_captured": _graphs(batcher) - g0, "device_allocs": _delta(_device_allocs(), a0),
                     "tokens": tokens})
        if profile is not None:
            profiles.append(_own_seconds(profile))

    def prompt(length: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, vocab) for _ in range(length))

    for n in args.bursts:
        measure(f"burst {n} x {args.prompt}", [GenerationRequest(prompt(args.prompt), args.gen,
                                                                 SamplingParams(temperature=0.0)) for _ in range(n)])
    mixed = []
    for i in range(args.max_seqs):
        length = rng.randint(1, batcher.sequence_tokens - 64)
        sampling = SamplingParams(temperature=0.0) if i % 3 else SamplingParams(temperature=0.8, seed=i)
        mixed.append(GenerationRequest(prompt(length), rng.randint(1, 64), sampling, top_logprobs=0 if i % 3 else 2))
    measure(f"mixed {args.max_seqs}", mixed)
    print(f"{'run':<22} {'seconds':>8} {'tokens':>8} {'kernels compiled':>17} {'graphs captured':>16} {'device allocs':>14}")
    for r in rows:
        allocs_text = "-" if r["device_allocs"] is None else str(r["device_allocs"])
        print(f"{r['run']:<22} {r['seconds']:>8.2f} {r['tokens']:>8} {r['kernels_compiled']:>17} {r['graphs_captured']:>16}"
              f" {allocs_text:>14}")
    extra = _first_burst_extra(profiles[0], profiles[1], args.host_profile) if len(profiles) > 1 else []
    if extra:
        print(f"host time the first burst spent and the second did not (own seconds, under cProfile): "
              f"{sum(profiles[0].values()):.3f} s against {sum(profiles[1].values()):.3f} s in all")
        for name, first, second in extra:
            print(f"  {first:8.4f} {second:8.4f}  {name}")
        rows[1]["host_first_only"] = [{"function": n, "first_s": a, "second_s": b} for n, a, b in extra]
    if args.json:
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor()
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "machine": device, "date": datetime.now(UTC).isoformat(),
                       "warm_up": done.summary(), "graph_keys": len(done.graph_keys), "graph_lengths": list(done.graph_lengths),
                       "packed_tokens": list(done.packed_tokens), "runs": rows}, f, indent=1)
    loaded.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
