"""``stagewise run``: generate from a prompt (token ids or text) and print the result.

With ``--json`` it prints one object: ``{"tokens": [...], "logprobs": [...], "placement": {...},
"charges": [...], "text"?: ...}`` — later checks depend on this shape; keep it stable. ``charges``: per
stage, each part planned beside measured (the workspace as this run's allocator peak on GPU stages).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.load_settings import add_model_arguments
from stagewise.engine.sampling_params import SamplingParams
from stagewise.errors import RequestError
from stagewise.server.load_display import placement_lines


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("run", help="generate from a prompt and print the result")
    p.add_argument("model", nargs="?", default=None, help="model directory, GGUF file, or random:PRESET (default: demo)")
    add_model_arguments(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt-tokens", type=_token_ids, help="comma-separated prompt token ids, e.g. 1,2,3")
    src.add_argument("-p", "--prompt", help="prompt text (needs a tokenizer)")
    src.add_argument("--chat", help="a user message, rendered with the model's chat template")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _token_ids(value: str) -> list[int]:
    """``--prompt-tokens 1,2,3``: at least one id, each a non-negative integer."""
    try:
        ids = [int(t) for t in value.split(",") if t.strip()]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids (e.g. 1,2,3), got {value!r}")
    return ids


def _prompt_ids(args: argparse.Namespace, loaded: Any) -> list[int]:
    if args.prompt_tokens is not None:
        return list(args.prompt_tokens)
    if loaded.tokenizer is None:
        raise RequestError(f"{loaded.name} has no tokenizer: use --prompt-tokens")
    if args.chat is not None:
        text = loaded.chat_template.render([{"role": "user", "content": args.chat}], add_generation_prompt=True,
                                           special_tokens=loaded.tokenizer.special_tokens_map)
        return loaded.tokenizer.encode(text)
    return loaded.tokenizer.encode(args.prompt if args.prompt is not None else "Once upon a time")


def run(args: argparse.Namespace) -> int:
    from stagewise.engine.generator import Generator  # torch: not for --help
    from stagewise.engine.model_loading import load_model_from_args
    from stagewise.runtime.peak_memory import PeakMeter

    loaded = load_model_from_args(args, quiet=args.json)
    try:
        prompt = _prompt_ids(args, loaded)
        stop = loaded.stop_token_ids if (loaded.tokenizer and args.prompt_tokens is None) else frozenset()
        request = GenerationRequest(
            tuple(prompt), args.max_tokens,
            SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed),
            stop_token_ids=frozenset(stop),
        )
        generator = Generator(loaded.pipeline, loaded.max_context, prefill_chunk=loaded.prefill_chunk)
        meter = PeakMeter(stage.spec.torch_device for stage in loaded.pipeline.stages)
        meter.start()
        tokens, logprobs = [], []
        for event in generator.stream(request):
            tokens.append(event.sample.token)
            logprobs.append(event.sample.logprob)
            if len(tokens) == 2:  # the prompt's step and the first decode step captured their graphs
                meter.checkpoint()
        loaded.peaks = meter.read()  # this run's peak above the resident tensors (GPU stages)
        out: dict[str, Any] = {"tokens": tokens, "logprobs": logprobs, "placement": loaded.placement_json,
                               "charges": [check.to_dict() for check in loaded.charge_checks()]}
        if loaded.tokenizer is not None:
            out["text"] = loaded.tokenizer.decode(tokens)
        if args.json:
            print(json.dumps(out))
        else:
            for line in placement_lines(loaded):
                print(line, file=sys.stderr)
            print(out.get("text", " ".join(map(str, tokens))))
        return 0
    finally:
        loaded.close()
