"""``stagewise bench``: prefill and decode speed of one placement, side by side with a baseline.

Reports prefill tokens/s, decode tokens/s, time to first token, per-stage step time, handoff time
per token, bytes read per decoded token and the fraction of the memory-bandwidth roofline. With
``--baseline transformers`` the same weights run through Hugging Face transformers (accelerate's
device map across the same devices) in the same process, and the ratio is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stagewise.engine.load_settings import add_model_arguments
from stagewise.hardware.sizes import format_bytes


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("bench", help="measure prefill / decode speed of a placement")
    p.add_argument("model", help="model directory, GGUF file, or random:PRESET")
    add_model_arguments(p)
    p.add_argument("--prompt", type=_at_least_one, default=512, help="prompt tokens")
    p.add_argument("--gen", type=_at_least_one, default=128, help="generated tokens")
    p.add_argument("--repeats", type=_at_least_one, default=3, help="timed repetitions (median reported)")
    p.add_argument("--baseline", choices=["transformers"], default=None)
    p.add_argument("--concurrency", type=_levels, default=None, metavar="N[,N...]",
                   help="instead: run N requests at once (continuous batching) for each N, and report aggregate "
                        "and per-request tokens/s and time to first token")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="with --concurrency: decode groups in flight (default: one per stage)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="with --concurrency: no sharing of cached prompt prefixes (each request's prompt differs anyway)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run, context=None, prefill_chunk=None)


def run(args: argparse.Namespace) -> int:
    from stagewise.engine.bench_runner import bench_loaded, bench_transformers  # torch: not for --help
    from stagewise.engine.hf_baseline import baseline_config_source
    from stagewise.engine.model_loading import load_model_from_args
    from stagewise.spec.profile import DEFAULT_PREFILL_CHUNK_TOKENS

    if args.baseline == "transformers":
        baseline_config_source(args.model)  # refused now, not after our own run

    # unless given (set_defaults left them None): a context just large enough, and the chunk `serve`
    # prefills in (like llama-bench's 512-token micro-batch: on a pipeline, chunks flow through the stages)
    if args.context is None:
        args.context = max(args.prompt + args.gen + 8, 64)
    if args.prefill_chunk is None:  # with --concurrency: the prefill step's token budget, as serve's
        args.prefill_chunk = DEFAULT_PREFILL_CHUNK_TOKENS if args.concurrency else min(args.prompt, DEFAULT_PREFILL_CHUNK_TOKENS)
    if args.concurrency is not None:
        return _run_concurrency(args)
    loaded = load_model_from_args(args, quiet=args.json)
    try:
        result: dict[str, Any] = {"command": " ".join(["stagewise", *sys.argv[1:]]),
                                  "placement": loaded.placement_json, "summary": loaded.placement_summary}
        result["stagewise"] = bench_loaded(loaded, args.prompt, args.gen, args.repeats)
    finally:
        loaded.close()
    if args.baseline == "transformers":
        result["transformers"] = bench_transformers(args.model, loaded, args.prompt, args.gen, args.repeats)
        ours, theirs = result["stagewise"], result["transformers"]
        result["ratio_vs_transformers"] = {
            "decode": ours["decode_tokens_per_s"] / theirs["decode_tokens_per_s"],
            "prefill": ours["prefill_tokens_per_s"] / theirs["prefill_tokens_per_s"],
        }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print_table(result)
    return 0


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def _levels(value: str) -> list[int]:
    try:
        levels = [int(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {value!r}") from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1, got {value!r}")
    return levels


def _run_concurrency(args: argparse.Namespace) -> int:
    from stagewise.engine.concurrency_bench import bench_concurrency
    from stagewise.engine.model_loading import load_model_from_args

    loaded = load_model_from_args(args, quiet=args.json, max_seqs=max(args.concurrency),
                                  prefix_snapshots=None if args.prefix_cache else 0)
    try:
        result: dict[str, Any] = {"command": " ".join(["stagewise", *sys.argv[1:]]),
                                  "placement": loaded.placement_json, "summary": loaded.placement_summary,
                                  "prompt_tokens": args.prompt, "gen_tokens": args.gen}
        result["levels"] = bench_concurrency(loaded, args.concurrency, args.prompt, args.gen, args.repeats,
                                             args.micro_batches, args.prefix_cache)
    finally:
        loaded.close()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(result["summary"])
    print(f"{'streams':>8} {'aggregate tok/s':>16} {'decode tok/s':>13} {'per request tok/s':>18} {'TTFT median':>12} "
          f"{'TTFT max':>12}")

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    for row in result["levels"]:
        print(f"{row['streams']:>8} {rate(row['aggregate_tokens_per_s']):>16} {rate(row['decode_tokens_per_s']):>13} "
              f"{rate(row['per_request_tokens_per_s']):>18} {_cell('ttft_s', row['ttft_s_median']):>12} "
              f"{_cell('ttft_s', row['ttft_s_max']):>12}")
    return 0


def _print_table(result: dict[str, Any]) -> None:
    ours = result["stagewise"]
    print(result["summary"])
    rows = [("prefill", "prefill_tokens_per_s"), ("decode", "decode_tokens_per_s"),
            ("time to first token", "ttft_s"), ("handoff per token (median)", "handoff_s_per_token"),
            ("handoff per token (device)", "handoff_device_s_per_token"),
            ("bytes read per token", "bytes_read_per_token"), ("roofline fraction", "roofline_fraction")]
    for label, key in rows:
        line = f"{label:28s} {_cell(key, ours.get(key)):>16}"
        if "transformers" in result and key in result["transformers"]:
            line += f"   transformers {_cell(key, result['transformers'][key]):>14}"
        print(line)
    for k, t in enumerate(ours.get("stage_step_s", [])):
        print(f"{f'stage {k} step (median)':28s} {_cell('step_s', t):>16}")
    if "ratio_vs_transformers" in result:
        ratio = result["ratio_vs_transformers"]
        print(f"vs transformers: decode {ratio['decode']:.2f}x, prefill {ratio['prefill']:.2f}x")


def _cell(key: str, value: Any) -> str:
    """One figure in the unit its key names: tokens/s, seconds (s/ms/us), bytes, a fraction as a percentage;
    ``-`` where there is none (a one-stage pipeline has no handoff)."""
    if value is None:
        return "-"
    if key.endswith("tokens_per_s"):
        return f"{value:,.1f} tok/s"
    if key.endswith("_s") or key.endswith("_s_per_token"):
        return format_seconds(value)
    if key.startswith("bytes"):
        return format_bytes(value)
    if key.endswith("fraction"):
        return f"{100 * value:.2f} %"
    return str(value)


def format_seconds(value: float) -> str:
    """``1.23 s``, ``572.1 ms``, ``12.3 us``: three significant figures or so, the unit by magnitude."""
    if value == 0:
        return "0 s"
    if abs(value) >= 1:
        return f"{value:.2f} s"
    if abs(value) >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.1f} us"
