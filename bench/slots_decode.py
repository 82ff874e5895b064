"""One stream's decode rate against the sequence slots loaded: decode cost must follow what is attended.

    python bench/slots_decode.py [--presets tiny-llama,tiny-qwen3.6,tiny-qwen3-moe] [--devices cpu:1x4GiB]
        [--slots 1,64] [--prompt 32] [--gen 128] [--repeats 5] [--threads 1] [--json bench/results/OUT.json]

For each preset and each slot count, the model is loaded with that many slots (``--max-seqs``; the KV
pool is then every slot's whole context), one greedy request runs through the batcher the server
uses, and its decode rate (tokens after the first over the time from the first to the last) is the
median of ``--repeats`` runs after an untimed one. The ratio of each count to the first is printed;
issue 30's target: 64 slots within 10 % of 1 on every path (CPU torch path included). ``--threads``:
torch's CPU threads (default 1: on a shared machine, spinning intra-op threads that lose their cores
make single runs 5-10x slower at random, which says nothing about the slots).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError


def _raise(error: StagewiseError) -> None:
    raise error


def decode_rate(batcher: Batcher, prompt: tuple[int, ...], gen: int) -> float:
    """Tokens after the first per second, for one greedy request alone."""
    stamps: list[float] = []

    def take(_event: TokenEvent) -> bool:
        stamps.append(time.perf_counter())
        return True

    batcher.add(Sequence(GenerationRequest(prompt, gen, SamplingParams(temperature=0.0)), take, _raise, lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="tiny-llama,tiny-qwen3.6,tiny-qwen3-moe")
    p.add_argument("--devices", default="cpu:1x4GiB")
    p.add_argument("--slots", default="1,64")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    slots = [int(s) for s in args.slots.split(",")]
    rows: list[dict[str, Any]] = []
    for preset in args.presets.split(","):
        base = None
        for count in slots:
            loaded = load_model(f"random:{preset}", args.devices, "single", args.context, max_seqs=count)
            try:
                batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk)
                prompt = tuple(i % loaded.config.vocab_size for i in range(1, args.prompt + 1))
                decode_rate(batcher, prompt, args.gen)  # untimed
                rates = [decode_rate(batcher, prompt, args.gen) for _ in range(args.repeats)]
            finally:
                loaded.close()
            rate = statistics.median(rates)
            base = base or rate
            rows.append({"preset": preset, "slots": count, "decode_tokens_per_s": rate, "runs": rates,
                         "ratio_to_first": rate / base})
            print(f"{preset:>16}  slots {count:>3}  {rate:9.1f} tok/s  x{rate / base:.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "machine": platform.node(), "processor": platform.processor(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"), "threads": args.threads, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
