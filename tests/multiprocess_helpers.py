"""Helpers for the multiprocess tests: a step trace that works on any pipeline, greedy tokens, and
requests run together through the batcher."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.generator import Generator
from stagewise.engine.sampling import SamplingParams
from stagewise.runtime.pipeline import Pipeline

PROMPT = [(i * 13 + 5) % 150 for i in range(21)]


@dataclass
class StepTrace:
    logits: list[torch.Tensor]
    hidden: list[torch.Tensor]
    tokens: list[int]


def step_trace(pipeline: Pipeline, prompt: list[int] = PROMPT, chunk: int = 8, decode_steps: int = 6,
               on_decode: dict[int, object] | None = None) -> StepTrace:
    """Chunked prefill (all logits) then greedy decode; ``on_decode[i]()`` runs before decode step i."""
    trace = StepTrace([], [], [])
    pipeline.reset(0)
    ids = torch.tensor(prompt)[None]
    out = None
    for lo in range(0, len(prompt), chunk):
        part = ids[:, lo : lo + chunk]
        out = pipeline.step(part, torch.arange(lo, lo + part.shape[1])[None], start=lo, all_logits=True)
        assert out.logits is not None
        trace.logits.append(out.logits.cpu().clone())
        trace.hidden.append(out.hidden.cpu().clone())
    assert out is not None and out.logits is not None
    pos = len(prompt)
    for i in range(decode_steps):
        if on_decode and i in on_decode:
            on_decode[i]()  # type: ignore[operator]
        token = int(out.logits[0, -1].argmax())
        trace.tokens.append(token)
        out = pipeline.step(torch.tensor([[token]]), torch.tensor([[pos]]), start=pos)
        assert out.logits is not None
        trace.logits.append(out.logits.cpu().clone())
        trace.hidden.append(out.hidden.cpu().clone())
        pos += 1
    return trace


def assert_same(a: StepTrace, b: StepTrace) -> None:
    """Bit-identical: every logits and features tensor, and the tokens."""
    assert a.tokens == b.tokens
    assert len(a.logits) == len(b.logits)
    for x, y in zip(a.logits, b.logits, strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)
    for x, y in zip(a.hidden, b.hidden, strict=True):
        assert torch.equal(x, y)


def greedy_tokens(pipeline: Pipeline, max_context: int, n: int = 8) -> list[int]:
    """Tokens the engine's Generator picks greedily for PROMPT."""
    gen = Generator(pipeline, max_context, prefill_chunk=8)
    request = GenerationRequest(tuple(PROMPT), n, SamplingParams(temperature=0.0))
    return [event.sample.token for event in gen.stream(request)]




def batch_requests(vocab: int, lengths: list[int], budgets: list[int], seed: int = 0) -> list[GenerationRequest]:
    """Greedy requests with random prompts of ``lengths`` tokens, ``budgets`` tokens each."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]
    return [GenerationRequest(p, n, SamplingParams(temperature=0.0)) for p, n in zip(prompts, budgets, strict=True)]


def identity_blocks(pipeline: Pipeline) -> None:
    """Give every row its whole context again (as after loading), for :func:`step_trace` after a batcher."""
    pool = pipeline.kv_pool
    assert pool is not None
    for row in range(pipeline.rows):
        pipeline.set_blocks(row, range(row * pool.blocks_per_row, (row + 1) * pool.blocks_per_row))
