"""Warm-up: synthetic requests run before a server reports ready, so that its first client does not
wait for kernel compilation and CUDA graph capture.

On a GPU stage the first step of each shape compiles Triton kernels (seconds to tens of seconds on a
machine without Triton's cache) and captures a CUDA graph; a CPU stage has neither, so only
pipelines with a GPU stage are warmed (:func:`needs_warm_up`), as llama.cpp's server warms up before
it listens and vLLM captures its graphs at start.

What a step compiles or captures (:mod:`stagewise.kernels.kernel_variants`): a Triton kernel per
specialization (constexpr values such as row blocks rounded to powers of two, each integer argument's
class: 1, a multiple of 16, other, pointer alignment), a decode graph per (first row, rows run,
attended length), the length one for the whole context where decode attention is the Triton kernel (it
reads each row's length on the device), a bucket each on the reference path. Every set is finite and
enumerated from the profile: decode steps at every shape the batcher can launch times every attended
length its graphs are keyed by (:mod:`~stagewise.engine.decode_warm_up`); packed steps of every
token-count class up to the prefill chunk (:func:`packed_token_counts`), alone and beside a decoding
row, which captures the packed steps' graph pieces at every token bucket up to the chunk
(:mod:`~stagewise.runtime.packed_graphs`: the counts land in each); greedy and host-sampled rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from stagewise.engine.batcher import Batcher
from stagewise.engine.decode_warm_up import GraphKey, decode_lengths, graph_keys, warm_decode_steps
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError
from stagewise.models.layers.moe import SparseMoE
from stagewise.runtime.packed_graphs import PackedGraphs
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS

SHORT_PROMPT_TOKENS = 8  # a chat turn's shapes: an eager prefill and decode of a short sequence
NEW_TOKENS = 4
CONCURRENT = 4  # short requests at once: batched decode steps of 2 and 4 sequences


BATCH_NEW_TOKENS = 3  # the batch-size phase: one prefill, then two decode steps of every sequence together


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up ran: its prompts' lengths, the tokens it generated, its wall time, and the
    decode step shapes ``(first row, rows run)`` it launched against those the batcher can launch
    (with no prompt being prefilled beside them: see :meth:`Batcher.decode_shapes`)."""

    prompt_tokens: tuple[int, ...]
    generated_tokens: int
    seconds: float
    decode_shapes: frozenset[tuple[int, int]] = frozenset()
    launchable_shapes: frozenset[tuple[int, int]] = frozenset()
    full_context_tokens: int = 0  # the prompt of the full-context step (0: not run)
    packed_tokens: tuple[int, ...] = ()  # prompt lengths of the packed-step sweep (alone and beside a decoding row)
    graph_keys: frozenset[GraphKey] = frozenset()  # decode steps run at (first row, rows run, attended length)
    graph_lengths: tuple[int, ...] = ()  # the attended lengths decode graphs are keyed by (one: every length)
    packed_buckets: tuple[int, ...] = ()  # token buckets whose packed-step graph pieces are captured
    packed_bucket_count: int = 0  # token buckets the in-process stages pad packed steps to (0: no packed graphs)

    @property
    def missing_shapes(self) -> frozenset[tuple[int, int]]:
        """Launchable decode shapes the warm-up did not run (empty when it covered them all)."""
        return self.launchable_shapes - self.decode_shapes

    def summary(self) -> str:
        """One line for the load banner: what was warmed and how long it took."""
        batches = sorted({run for _, run in self.decode_shapes})
        missing = f"; {len(self.missing_shapes)} launchable shapes NOT warmed" if self.missing_shapes else ""
        full = f", a full-context step ({self.full_context_tokens:,}-token prompt)" if self.full_context_tokens else ""
        lengths = self.graph_lengths
        if len(lengths) == 1:  # one graph a shape serves every attended length up to it
            graphs = f", a graph each for every attended length up to {lengths[0]:,} ({len(self.graph_keys)} steps)"
        else:
            graphs = (f" at {len(lengths)} attended-length buckets ({lengths[0]:,}..{lengths[-1]:,}: "
                      f"{len(self.graph_keys)} steps)") if lengths else ""
        packed = (f"; packed steps of {len(self.packed_tokens)} prompt lengths alone and beside a decoding row"
                  if self.packed_tokens else "")
        if self.packed_bucket_count:
            packed += (f", their graph pieces at {len(self.packed_buckets)} of {self.packed_bucket_count} token "
                       f"buckets (up to {max(self.packed_buckets, default=0):,})")
        return (f"warmed up in {self.seconds:.1f} s: {len(self.prompt_tokens)} requests (prompts of "
                f"{min(self.prompt_tokens):,}..{max(self.prompt_tokens):,} tokens{packed}), decode steps of "
                f"{', '.join(map(str, batches))} rows ({len(self.decode_shapes)} shapes of {len(self.launchable_shapes)} "
                f"launchable){graphs}{missing}{full}")


def needs_warm_up(model: LoadedModel) -> bool:
    """True when a stage of ``model`` runs on a GPU (compiled kernels, CUDA graphs)."""
    stages = model.placement_json.get("stages", [])
    return any(str(stage.get("device", "")).split(":")[0] == "cuda" for stage in stages)


def packed_token_counts(prefill_chunk: int,
                        classes: Callable[[int], tuple[object, ...]] | None = None) -> tuple[int, ...]:
    """Prompt lengths whose packed steps cover every token-count class up to ``prefill_chunk``: 1, each
    power of two and the next count (a multiple of 16 and not, and each power-of-two block a count
    rounds up to: Triton specializes on those, :mod:`~stagewise.kernels.kernel_variants`), the chunk and
    one below it, and, where ``classes`` names what else a step of ``n`` tokens specializes on (a MoE
    layer's slot and block counts: :func:`launch_classes`), the first count of each class it gives.
    Ascending."""
    counts = {1, prefill_chunk, max(1, prefill_chunk - 1)}
    power = 2
    while power <= prefill_chunk:
        counts.update((power, min(power + 1, prefill_chunk)))
        power *= 2
    if classes is not None:
        seen = {classes(n) for n in counts}
        for n in range(1, prefill_chunk + 1):
            key = classes(n)
            if key not in seen:
                seen.add(key)
                counts.add(n)
    return tuple(sorted(counts))


def launch_classes(batcher: Batcher) -> Callable[[int], tuple[object, ...]] | None:
    """What a packed step of ``n`` tokens specializes on in the pipeline's MoE layers beside ``n`` itself
    (the routed slot count ``n * top_k`` and the alignment's blocks: their classes differ from ``n``'s),
    on every stage's device; None when no stage in this process has one."""
    layers = [(module, stage.device) for stage in batcher.pipeline.stages
              for module in stage.model.modules() if isinstance(module, SparseMoE)]
    if not layers:
        return None
    return lambda n: tuple(module.launch_classes(n, device) for module, device in layers)


def warm_up(batcher: Batcher, vocab_size: int) -> WarmUp:
    """Run requests through ``batcher`` and discard their tokens: a short prompt, then one of two of its
    full prefill chunks and a partial one, then up to :data:`CONCURRENT` short ones at once (batched
    decode at the small batch buckets, the staging row's prefill), one sampled on the host with
    log-probabilities beside a greedy one, then, for every decode step shape the batcher can launch
    (:meth:`Batcher.decode_shapes`: each batch-size bucket, each micro-batch group's first row) not
    launched yet, that many one-token prompts at once; then a prompt of each of
    :func:`packed_token_counts` alone and arriving while a stream decodes (a packed step beside it); for
    each token bucket whose packed-step pieces those left uncaptured, prompts that make one step of exactly
    that many tokens (:func:`bucket_prompts`); last, a decode step of free rows for every launchable shape at
    every attended length its graphs are keyed by (one, or each bucket on the reference path:
    :func:`~stagewise.engine.decode_warm_up.warm_decode_steps`). The next requests reset the sequence
    slots, as after any request."""
    t0 = time.perf_counter()
    lengths: list[int] = []
    counts: list[int] = []
    max_context = batcher.sequence_tokens  # the context, or the KV pool when it is smaller
    greedy = SamplingParams(temperature=0.0)

    def request(wanted: int, sampling: SamplingParams = greedy, top_logprobs: int = 0,
                first: int = 1) -> GenerationRequest:
        length = max(1, min(wanted, max_context - NEW_TOKENS))
        lengths.append(length)
        prompt = tuple(i % vocab_size for i in range(first, first + length))
        return GenerationRequest(prompt, max(1, min(NEW_TOKENS, max_context - length)), sampling,
                                 top_logprobs=top_logprobs)

    def tally(_event: TokenEvent) -> bool:
        counts.append(1)
        return True

    def run(requests: list[GenerationRequest]) -> None:
        for req in requests:
            batcher.add(Sequence(req, tally, _raise, lambda: False))
        while batcher.active:
            batcher.iterate()
        batcher.drain()

    def beside(req: GenerationRequest) -> None:
        """``req`` arriving while a one-token prompt's stream decodes: its chunks packed beside that row."""
        stream = GenerationRequest((1,), min(BATCH_NEW_TOKENS + 1, max_context - 1), greedy)
        lengths.append(1)
        before = len(counts)
        batcher.add(Sequence(stream, tally, _raise, lambda: False))
        while batcher.active and len(counts) == before:  # until it decodes
            batcher.iterate()
        run([req])

    run([request(SHORT_PROMPT_TOKENS)])
    run([request(2 * batcher.prefill_chunk + 1)])
    run([request(SHORT_PROMPT_TOKENS + i) for i in range(min(CONCURRENT, batcher.slots))])
    sampled = SamplingParams(temperature=1.0, top_p=0.9, top_k=40, seed=0)  # the host's sampler
    run([request(SHORT_PROMPT_TOKENS, sampled, top_logprobs=2)] + [request(SHORT_PROMPT_TOKENS)] * (batcher.slots > 1))
    # every decode shape the batcher can launch: for each, that many one-token prompts at once (one
    # packed prefill step of them all, in rows 0 ..), then decode steps of them all together
    launchable = batcher.decode_shapes()
    for shape, count in sorted(launchable.items(), key=lambda item: item[1]):
        if shape in batcher.launched_shapes:
            continue  # an earlier count launched it already
        one_token = GenerationRequest((1,), min(BATCH_NEW_TOKENS, max_context - 1), greedy)
        lengths.append(1)
        run([one_token] * count)
    packed = tuple(n for n in packed_token_counts(batcher.prefill_chunk, launch_classes(batcher))
                   if n <= max_context - NEW_TOKENS)
    for n in packed:
        run([request(n)])
        if batcher.slots > 1:
            beside(request(n))
    pieces = [p for p in (getattr(stage, "packed", None) for stage in batcher.pipeline.stages) if p is not None]
    firsts = iter(range(2, 1 << 30))  # each filling prompt's first token: no two share a cached block
    for bucket in (b for b in (pieces[0].buckets if pieces else ()) if b not in _captured(pieces)):
        parts = bucket_prompts(bucket, KV_BLOCK_TOKENS, _interval_tokens(batcher))
        if bucket <= batcher.prefill_chunk and len(parts) <= batcher.slots and max(parts) <= max_context - NEW_TOKENS:
            run([request(n, first=next(f for f in firsts if f % vocab_size != 1)) for n in parts])
    attended = decode_lengths(batcher)
    keys = warm_decode_steps(batcher, graph_keys(launchable, attended))
    warmed = frozenset(batcher.launched_shapes) & frozenset(launchable)
    captured = _captured(pieces)
    return WarmUp(tuple(lengths), len(counts), time.perf_counter() - t0, warmed, frozenset(launchable),
                  packed_tokens=packed, graph_keys=keys, graph_lengths=attended,
                  packed_buckets=tuple(sorted(captured)), packed_bucket_count=len(pieces[0].buckets) if pieces else 0)


def bucket_prompts(bucket: int, block_tokens: int, interval_tokens: int = 0) -> tuple[int, ...]:
    """Prompt lengths that, prefilled together, make one packed step of exactly ``bucket`` tokens although a
    prompt is cut where a prefix snapshot is taken (at its last whole KV block, and every ``interval_tokens``
    where that is not 0): runs of ``interval_tokens``, then the rest's whole blocks, then its part-block."""
    runs = [interval_tokens] * (bucket // interval_tokens) if interval_tokens else []
    rest = bucket - sum(runs)
    return tuple(runs + [n for n in (rest // block_tokens * block_tokens, rest % block_tokens) if n])


def _interval_tokens(batcher: Batcher) -> int:
    """Every how many tokens a prompt's prefix snapshots are taken (0: only at its last whole KV block)."""
    snapshots = batcher.kv.snapshots
    return KV_BLOCK_TOKENS * snapshots.interval_blocks if snapshots is not None else 0


def _captured(pieces: list[PackedGraphs]) -> frozenset[int]:
    """The token buckets whose packed-step pieces every in-process stage has captured."""
    return frozenset.intersection(*(frozenset(p.graphs) for p in pieces)) if pieces else frozenset()


def full_context_prompt(batcher: Batcher) -> int:
    """Prompt length of the full-context step: whole prefill chunks up to the last position a sequence
    holds (its last chunk a full one at the longest attended length), or all of it below one chunk."""
    limit = batcher.sequence_tokens - 1  # one position left for the token it generates
    chunk = batcher.prefill_chunk
    return limit // chunk * chunk if limit >= chunk else max(1, limit)


def full_context_step(batcher: Batcher, vocab_size: int) -> int:
    """One greedy request of :func:`full_context_prompt` tokens and one generated token: the largest step
    (a full prefill chunk) at the longest attended length, the peak the load check measures. Returns
    the prompt's length."""
    length = full_context_prompt(batcher)
    prompt = tuple(i % vocab_size for i in range(1, length + 1))
    batcher.add(Sequence(GenerationRequest(prompt, 1, SamplingParams(temperature=0.0)), lambda _e: True, _raise,
                         lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    return length


def _raise(error: StagewiseError) -> None:
    raise error
