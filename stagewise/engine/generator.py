"""Generator: one sequence through the pipeline — chunked prefill, then decode token by token."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from stagewise.engine.sampling import Sample, Sampler, SamplingParams
from stagewise.errors import ContextLengthExceeded, RequestError
from stagewise.kernels.triton_launch import use_triton
from stagewise.runtime.executor import Executor

CancelCheck = Callable[[], bool]
MAX_TOP_LOGPROBS = 20  # as OpenAI


@dataclass(frozen=True)
class GenerationRequest:
    """Token-level request: the prompt ids, how many tokens to generate, and how to sample."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("the prompt is empty")
        if self.max_tokens < 1:
            raise RequestError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``finish_reason`` is set on the last one (``stop`` or ``length``)."""

    index: int
    sample: Sample
    finish_reason: str | None = None


class Generator:
    """Runs requests one at a time in sequence slot 0 of a pipeline built for ``max_context``; row 0
    takes the KV pool's first blocks (a context's worth, or the whole pool when it is smaller)."""

    def __init__(self, pipeline: Executor, max_context: int, prefill_chunk: int = 512) -> None:
        self.pipeline = pipeline
        pool = pipeline.kv_pool
        self.blocks: list[int] = list(range(min(pool.blocks_per_row, pool.blocks))) if pool is not None else []
        self.max_context = min(max_context, len(self.blocks) * pool.block_tokens) if pool is not None else max_context
        self.prefill_chunk = prefill_chunk
        self.vocab_size = pipeline.stages[0].model.config.vocab_size

    def check(self, request: GenerationRequest) -> None:
        n = len(request.prompt_ids)
        if n >= self.max_context:
            raise ContextLengthExceeded(
                f"the prompt has {n} tokens; this model's context is {self.max_context} tokens"
            )
        bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")

    def stream(self, request: GenerationRequest, cancel: CancelCheck | None = None) -> Iterator[TokenEvent]:
        """Yield tokens as they are decided. Raises StepCancelled / StepFailed (rolled back)."""
        self.check(request)
        sampler = Sampler(request.sampling)
        self.pipeline.reset(0)
        if self.blocks:
            self.pipeline.set_blocks(0, self.blocks)  # a batcher may have left row 0 without blocks
        prompt = torch.tensor(request.prompt_ids, dtype=torch.long)[None]  # (1, P)
        n = prompt.shape[1]
        logits = None
        for lo in range(0, n, self.prefill_chunk):
            chunk = prompt[:, lo : lo + self.prefill_chunk]
            positions = torch.arange(lo, lo + chunk.shape[1])[None]
            logits = self.pipeline.step(chunk, positions, start=lo, cancel=cancel).logits
        assert logits is not None
        budget = min(request.max_tokens, self.max_context - n)
        if sampler.plain_greedy(request.top_logprobs) and use_triton(logits) and self.pipeline.device_tokens:
            yield from self._lookahead(request, sampler, logits, n, budget, cancel)
            return
        position = n
        for index in range(budget):
            sample = sampler.sample(logits[0, -1], request.top_logprobs)
            stop = sample.token in request.stop_token_ids
            last = stop or index == budget - 1
            reason = ("stop" if stop else "length") if last else None
            yield TokenEvent(index, sample, reason)
            if last:
                return
            token = torch.tensor([[sample.token]])
            logits = self.pipeline.step(token, torch.tensor([[position]]), start=position, cancel=cancel).logits
            assert logits is not None
            position += 1

    def _lookahead(self, request: GenerationRequest, sampler: Sampler, logits: torch.Tensor, position: int,
                   budget: int, cancel: CancelCheck | None) -> Iterator[TokenEvent]:
        """Greedy decode with the host one token behind the device.

        Each token is sampled on the device and fed to the next step there; the step is launched
        before the host reads the token back, so the GPUs never wait for the host between tokens.
        The step after the last yielded token (a stop token, or the consumer stopping) has then
        already run: it wrote only past the sequence's end, which the next sequence's reset and
        positions overwrite. Same tokens as :meth:`stream`'s host loop (the same kernel picks them).
        """
        pair, token = self.pipeline.greedy_token(logits[0, -1])  # on the last stage's device
        for index in range(budget):
            last = index == budget - 1
            host, ready = _start_read(pair)
            following: tuple[torch.Tensor, torch.Tensor] | None = None
            if not last:
                step_logits = self.pipeline.step(token, torch.tensor([[position]]), start=position, cancel=cancel).logits
                assert step_logits is not None
                following = self.pipeline.greedy_token(step_logits[0, -1])
            if ready is not None:
                ready.synchronize()
            sample = sampler.accept(*host.tolist())
            stop = sample.token in request.stop_token_ids
            done = stop or last
            yield TokenEvent(index, sample, ("stop" if stop else "length") if done else None)
            if done:
                return
            assert following is not None  # launched above: this was not the last token
            pair, token = following
            position += 1


_read_streams: dict[torch.device, torch.cuda.Stream] = {}


def _start_read(pair: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Start copying ``pair`` to the host; returns the host tensor and the event to wait on (None:
    already there)."""
    if pair.device.type != "cuda":
        return pair.clone(), None
    host = torch.empty(pair.shape, dtype=pair.dtype, pin_memory=True)
    side = _read_streams.get(pair.device)
    if side is None:
        side = _read_streams[pair.device] = torch.cuda.Stream(pair.device)
    side.wait_stream(torch.cuda.current_stream(pair.device))  # on a side stream: the next step never waits for it
    pair.record_stream(side)
    with torch.cuda.device(pair.device), torch.cuda.stream(side):
        host.copy_(pair, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    return host, ready
