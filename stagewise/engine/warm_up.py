"""Warm-up: synthetic requests run before a server reports ready, so that its first client does not
wait for kernel compilation and CUDA graph capture.

On a GPU stage the first step of each shape compiles Triton kernels (seconds to tens of seconds on a
machine without Triton's cache) and captures a CUDA graph; a CPU stage has neither, so only
pipelines with a GPU stage are warmed (:func:`needs_warm_up`), as llama.cpp's server warms up before
it listens and vLLM captures its graphs at start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stagewise.engine.generator import GenerationRequest, Generator
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.sampling import SamplingParams

SHORT_PROMPT_TOKENS = 8  # a chat turn's shapes: an eager prefill and decode at the smallest bucket
NEW_TOKENS = 4


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up ran: its prompts' lengths, the tokens it generated, and its wall time."""

    prompt_tokens: tuple[int, ...]
    generated_tokens: int
    seconds: float


def needs_warm_up(model: LoadedModel) -> bool:
    """True when a stage of ``model`` runs on a GPU (compiled kernels, CUDA graphs)."""
    stages = model.placement_json.get("stages", [])
    return any(str(stage.get("device", "")).split(":")[0] == "cuda" for stage in stages)


def warm_up(generator: Generator, vocab_size: int) -> WarmUp:
    """Run two greedy requests through ``generator`` and discard their tokens: a short prompt, then one
    of two of its full prefill chunks and a partial one (the chunk graphs at two attended lengths, the
    eager tail, decode at the longer length). The next request resets the sequence slot, as after
    any request."""
    t0 = time.perf_counter()
    lengths = []
    generated = 0
    max_context = generator.max_context
    for wanted in (SHORT_PROMPT_TOKENS, 2 * generator.prefill_chunk + 1):
        length = max(1, min(wanted, max_context - NEW_TOKENS))
        new_tokens = max(1, min(NEW_TOKENS, max_context - length))
        prompt = tuple(i % vocab_size for i in range(1, length + 1))
        request = GenerationRequest(prompt, new_tokens, SamplingParams(temperature=0.0))
        generated += sum(1 for _ in generator.stream(request))
        lengths.append(length)
    return WarmUp(tuple(lengths), generated, time.perf_counter() - t0)
