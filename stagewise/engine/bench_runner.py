"""Timing of a loaded model (and of transformers on the same weights) for ``stagewise bench``.

Times are wall-clock with every device synchronized at the edges of the timed region; per-stage
and handoff times come from a separate pass with per-stage synchronization (which adds a little
overhead of its own), so the headline tokens/s are measured without it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.sampling_params import SamplingParams
from stagewise.hardware.measure import copy_bandwidth_bytes_per_s

BENCH_GPU_COPY_BYTES = 512 << 20  # roofline bandwidth measurement on a GPU stage


def _sync_all() -> None:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def _prompt(vocab: int, n: int, seed: int = 0) -> tuple[int, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, vocab, (n,), generator=gen).tolist())


def _one(generator: Generator, prompt: tuple[int, ...], gen: int) -> tuple[float, float, list[int]]:
    """(time to first token s, decode s for the remaining tokens, tokens)."""
    request = GenerationRequest(prompt, gen, SamplingParams(temperature=0.0))
    _sync_all()
    t0 = time.perf_counter()
    tokens: list[int] = []
    t_first = 0.0
    for event in generator.stream(request):
        tokens.append(event.sample.token)
        if len(tokens) == 1:
            t_first = time.perf_counter() - t0
    _sync_all()
    return t_first, time.perf_counter() - t0 - t_first, tokens


def bench_loaded(loaded: LoadedModel, prompt_tokens: int, gen_tokens: int, repeats: int) -> dict[str, Any]:
    """Median prefill / decode speed over ``repeats`` runs of one greedy request, prefilled in the
    loaded profile's chunks."""
    pipeline = loaded.pipeline
    prefill_chunk = loaded.prefill_chunk
    generator = Generator(pipeline, loaded.max_context, prefill_chunk=prefill_chunk)
    prompt = _prompt(loaded.config.vocab_size, prompt_tokens)
    _one(generator, prompt, gen_tokens)  # warm-up on the timed shapes: kernels, graphs, allocator
    ttfts: list[float] = []
    decodes: list[float] = []
    tokens: list[int] = []
    for _ in range(max(repeats, 1)):
        ttft, decode_s, tokens = _one(generator, prompt, gen_tokens)
        ttfts.append(ttft)
        decodes.append(decode_s)
    ttft = statistics.median(ttfts)
    decode_s = statistics.median(decodes)
    decode_tps = (len(tokens) - 1) / decode_s if decode_s > 0 else float("nan")
    # per-stage step and handoff times, with a synchronization after each stage
    pipeline.timing = True
    stage_s: list[list[float]] = [[] for _ in pipeline.stages]
    handoff_s: list[float] = []
    handoff_device_s: list[float] = []
    request = GenerationRequest(prompt[:16], 33, SamplingParams(temperature=0.0))
    for i, _event in enumerate(generator.stream(request)):
        if i == 0:
            continue  # the prefill step
        for k, t in enumerate(pipeline.last_timings.stage_s):
            stage_s[k].append(t)
        handoff_s.extend(pipeline.last_timings.handoff_s)
        handoff_device_s.extend(pipeline.last_timings.handoff_device_s)
    pipeline.timing = False
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "prefill_chunk_tokens": prefill_chunk,
        "generated_tokens": len(tokens),
        "prefill_tokens_per_s": prompt_tokens / ttft,
        "ttft_s": ttft,
        "decode_tokens_per_s": decode_tps,
        "stage_step_s": [statistics.median(s) if s else 0.0 for s in stage_s],
        "handoff_s_per_token": statistics.median(handoff_s) if handoff_s else 0.0,
        # GPU to GPU: the copy's own device time (CUDA events), without the host's send/sync overhead
        "handoff_device_s_per_token": statistics.median(handoff_device_s) if handoff_device_s else None,
        "tokens_head": tokens[:16],
    }
    if loaded.spec is not None and loaded.topology is not None:
        read = sum(b.read_bytes_per_token for b in loaded.spec.blocks) + loaded.spec.exit.read_bytes_per_token
        devices = [loaded.topology.device(s.spec.device) for s in pipeline.stages]
        out["bytes_read_per_token"] = read
        out["datasheet_bandwidth_bytes_per_s"] = min(d.memory_bandwidth_bytes_per_s for d in devices)
        # the roofline is the bandwidth measured now, on the stages' own devices (the slowest bounds it)
        bandwidth = min(_bandwidth(d) for d in {str(s.device) for s in pipeline.stages})
        out["bandwidth_bytes_per_s"] = bandwidth
        out["bandwidth_measured"] = True
        out["roofline_decode_tokens_per_s"] = bandwidth / read
        out["roofline_fraction"] = decode_tps * read / bandwidth
    return out


def _bandwidth(device: str) -> float:
    """Copy bandwidth of one stage device: on a GPU a 512 MiB copy (past any cache, small enough beside
    a full stage's weights), on a CPU the measurement's default."""
    return copy_bandwidth_bytes_per_s(device, BENCH_GPU_COPY_BYTES if device.startswith("cuda") else None)


def bench_transformers(model: str, loaded: LoadedModel, prompt_tokens: int, gen_tokens: int,
                       repeats: int) -> dict[str, Any]:
    """The same weights through transformers (+ accelerate's device map over the same devices)."""
    from stagewise.engine.hf_baseline import build_hf_model

    hf, first_device = build_hf_model(model, loaded)
    prompt = torch.tensor([_prompt(loaded.config.vocab_size, prompt_tokens)], device=first_device)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    with torch.inference_mode():
        hf.generate(prompt, max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False)  # warm-up
        prefills, totals = [], []
        for _ in range(max(repeats, 1)):
            _sync_all()
            t0 = time.perf_counter()
            hf(prompt)
            _sync_all()
            prefills.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hf.generate(prompt, max_new_tokens=gen_tokens, min_new_tokens=gen_tokens, do_sample=False)
            _sync_all()
            totals.append(time.perf_counter() - t0)
    prefill_s = statistics.median(prefills)
    decode_s = max(statistics.median(totals) - prefill_s, 1e-9)
    del hf
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"prefill_tokens_per_s": prompt_tokens / prefill_s, "ttft_s": prefill_s,
            "decode_tokens_per_s": (gen_tokens - 1) / decode_s}
