"""Continuous batching on CPU (virtual devices): staged = single for the same schedule (bit for bit, tokens,
log-probabilities and every block's state; prompts prefilled in packed steps beside the decoding rows), for
attention-only and hybrid models, batched = alone within the tolerance transformers itself shows
between batch 1 and batch N, seeded sampling independent of the batch, cancellation isolated, slots reused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.decode_groups import batch_bucket
from stagewise.engine.generation_request import GenerationRequest, TokenEvent
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import StagewiseError, StepCancelled
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.pipeline import Pipeline
from tests.batch_runs import Run, run_batch
from tests.hf_models import make_hf_model

GREEDY = SamplingParams(temperature=0.0)
PRESETS = ["random:tiny-llama", "random:tiny-qwen3.6", "random:tiny-qwen3-moe"]


def _prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]


def _run(batcher: Batcher, requests: list[GenerationRequest],
         cancel_after: dict[int, int] | None = None) -> tuple[Run, list[StagewiseError | None]]:
    """``run_batch``; request ``i`` is cancelled once it has ``cancel_after[i]`` tokens."""
    limits = cancel_after or {}
    return run_batch(batcher, requests, cancelled=lambda i, n: i in limits and n >= limits[i])


@pytest.fixture(scope="module", params=PRESETS)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    single = load_model(request.param, "cpu:1x4GiB", "single", 96, max_seqs=4, prefill_chunk=16)  # CPU, as staged
    staged = load_model(request.param, "cpu:2x2GiB", "pipeline:2", 96, max_seqs=4, prefill_chunk=16)
    yield single, staged
    single.close()
    staged.close()


def _requests(vocab: int) -> list[GenerationRequest]:
    # different prompt lengths (one over two prefill chunks) and budgets: sequences finish at different
    # steps, so rows are compacted and later requests join while others decode
    prompts = _prompts(vocab, [5, 37, 11, 3, 20, 9])
    budgets = [12, 5, 20, 8, 3, 10]
    return [GenerationRequest(p, n, GREEDY) for p, n in zip(prompts, budgets, strict=True)]


def _states(model: LoadedModel) -> dict[tuple[int, str], torch.Tensor]:
    return {(index, name): tensor for stage in model.pipeline.stages for index, state in stage.states.items()
            for name, tensor in state.tensors().items()}


def test_staged_equals_single_for_the_same_schedule(pair: tuple[LoadedModel, LoadedModel],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    single, staged = pair
    requests = _requests(single.config.vocab_size)
    # two micro-batches on both: the same schedule (a staged pipeline's default, asked of one device)
    mixed = _prefill_steps(staged.pipeline, monkeypatch)
    ours, _ = _run(Batcher(single.pipeline, single.max_context, 16, micro_batches=2), requests)
    theirs, _ = _run(Batcher(staged.pipeline, staged.max_context, 16, micro_batches=2), requests)
    assert any(prompt < tokens for _, prompt, tokens in mixed), mixed  # prompts beside decoding rows, both stages
    assert ours == theirs  # tokens and log-probabilities, exactly
    assert [len(r) for r in ours] == [r.max_tokens for r in requests]
    a, b = _states(single), _states(staged)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_batched_matches_alone(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    requests = _requests(single.config.vocab_size)
    batcher = Batcher(single.pipeline, single.max_context, 16)
    together, _ = _run(batcher, requests)
    for request, got in zip(requests, together, strict=True):
        alone, _ = _run(batcher, [request])
        _assert_close(got, alone[0])


def _assert_close(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    """The same tokens; log-probabilities within :data:`BATCH_TOLERANCE`."""
    assert [t for t, _ in got] == [t for t, _ in want]
    diff = max(abs(x - y) for (_, x), (_, y) in zip(got, want, strict=True))
    assert diff <= BATCH_TOLERANCE, diff


# transformers' own batch-1 vs batch-N difference in log-probabilities on CPU float32 (measured by
# test_transformers_batch_tolerance below: 1.9e-6 on this machine); ours must stay within it
BATCH_TOLERANCE = 1e-5


def test_transformers_batch_tolerance(tmp_path: Path) -> None:
    """The tolerance above is what transformers itself shows between one sequence alone and the same
    sequence among others (left-padded, masked), so holding ours to it is holding ours to the reference."""
    model: Any = make_hf_model("llama", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=211),
                               tmp_path)
    prompts = _prompts(211, [5, 17, 9, 12], seed=3)
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        batched = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, -1].float(), -1)
        worst = 0.0
        for i, p in enumerate(prompts):
            alone = torch.log_softmax(model(input_ids=torch.tensor([p])).logits[:, -1].float(), -1)
            worst = max(worst, float((alone[0] - batched[i]).abs().max()))
    assert 0 < worst <= BATCH_TOLERANCE, worst


def test_seeded_sampling_is_the_same_in_any_batch(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    vocab = single.config.vocab_size
    seeded = GenerationRequest(_prompts(vocab, [7], seed=5)[0], 12, SamplingParams(temperature=0.9, top_p=0.95, seed=7))
    batcher = Batcher(single.pipeline, single.max_context, 16)
    alone, _ = _run(batcher, [seeded])
    crowd, _ = _run(batcher, [*_requests(vocab)[:3], seeded])
    assert [t for t, _ in crowd[-1]] == [t for t, _ in alone[0]]


def test_cancelling_one_leaves_the_others_alone(pair: tuple[LoadedModel, LoadedModel]) -> None:
    _, staged = pair
    requests = _requests(staged.config.vocab_size)
    batcher = Batcher(staged.pipeline, staged.max_context, 16)
    full, _ = _run(batcher, requests)
    cut, errors = _run(batcher, requests, cancel_after={2: 4})
    assert isinstance(errors[2], StepCancelled) and 4 <= len(cut[2]) < len(full[2])
    for i in (0, 1, 3, 4, 5):  # the others: the same tokens (their batches shrank: within the tolerance)
        _assert_close(cut[i], full[i])


def test_more_requests_than_slots_queue_and_reuse_rows(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    batcher = Batcher(single.pipeline, single.max_context, 16)
    requests = _requests(single.config.vocab_size)
    first, _ = _run(batcher, requests[:4])  # fills the four slots
    rest, _ = _run(batcher, requests[4:])  # reuses them after a compaction
    again, _ = _run(batcher, requests)
    for got, want in zip(again, first + rest, strict=True):  # six requests, four slots: two waited for rows
        _assert_close(got, want)


def test_batch_buckets() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 33, 64)] == [1, 2, 4, 8, 8, 16, 16, 24, 40, 64]


def test_auto_max_seqs_takes_the_most_slots_that_fit() -> None:
    # the demo's two 11.5 MiB devices cannot hold 64 slots on two stages: auto must step down to what
    # fits (the planner refusing the larger counts is not an error), and one more slot must not fit
    from stagewise.placement.profile_fit import AUTO_BATCHES

    loaded = load_model(None, max_seqs=None)
    try:
        rows = loaded.pipeline.rows
        assert rows == loaded.profile.batch and rows in AUTO_BATCHES and rows < AUTO_BATCHES[0]
        bigger = AUTO_BATCHES[AUTO_BATCHES.index(rows) - 1]
        with pytest.raises(StagewiseError):  # at the same prefill chunk (a set count may trade the chunk down)
            load_model(None, max_seqs=bigger, prefill_chunk=loaded.prefill_chunk).close()
    finally:
        loaded.close()


def _prefill_steps(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Record ``(prompts, prompt tokens, tokens)`` of every step ``pipeline`` runs that prefills: a
    packed step's prompt segments beside its decoding rows (a rectangle of rows x tokens would count too)."""
    steps: list[tuple[int, int, int]] = []
    real = pipeline.step

    def step(tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        layout: StepLayout | None = kwargs.get("layout")
        if layout is not None and layout.decoding < len(layout.rows):
            prompt = layout.lengths[layout.decoding :]
            steps.append((len(prompt), sum(prompt), layout.tokens))
        elif layout is None and tokens.shape[1] > 1:
            rows, width = int(tokens.shape[0]), int(tokens.shape[1])
            steps.append((rows, rows * width, rows * width))
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(pipeline, "step", step)
    return steps


def test_new_prompts_are_prefilled_together(pair: tuple[LoadedModel, LoadedModel],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued prompts share prefill steps (within the chunk, decoding rows' tokens counted in a packed
    step) and still give their alone outputs."""
    single, _ = pair
    vocab = single.config.vocab_size
    requests = [GenerationRequest(p, 6, GREEDY) for p in _prompts(vocab, [8, 8, 12, 30, 7, 16], seed=9)]
    batcher = Batcher(single.pipeline, single.max_context, 16)
    alone = [_run(batcher, [r])[0][0] for r in requests]
    steps = _prefill_steps(single.pipeline, monkeypatch)
    together, _ = _run(batcher, requests)
    assert any(prompts > 1 for prompts, _, _ in steps), steps  # some step prefilled several prompts
    assert all(tokens <= 16 for _, _, tokens in steps)  # the chunk is the step's token budget
    assert sum(prompt for _, prompt, _ in steps) == sum(len(r.prompt_ids) for r in requests)  # no padding
    # first come, first served: every step full but the last prompts' (budget 16, four rows)
    assert sum(tokens < 16 for _, _, tokens in steps) <= 2, steps
    for got, want in zip(together, alone, strict=True):
        _assert_close(got, want)


def test_cancelling_a_prompt_while_prefilled_with_others(pair: tuple[LoadedModel, LoadedModel]) -> None:
    """A sequence cancelled while it stages among others leaves; the staging rows above it close up."""
    _, staged = pair
    vocab = staged.config.vocab_size
    requests = [GenerationRequest(p, 5, GREEDY) for p in _prompts(vocab, [6, 20, 24, 28], seed=11)]
    batcher = Batcher(staged.pipeline, staged.max_context, 16)
    full, _ = _run(batcher, requests)
    polls = {"n": 0}

    def cancel_second(i: int, _: int) -> bool:  # request 1, asked once per step while it stages: at the second
        if i != 1:
            return False
        polls["n"] += 1
        return polls["n"] >= 2

    out, errors = run_batch(batcher, requests, cancelled=cancel_second)
    assert isinstance(errors[1], StepCancelled) and out[1] == []
    for i in (0, 2, 3):
        _assert_close(out[i], full[i])


def test_a_decoding_stream_waits_one_step_per_token_while_prompts_prefill(
        pair: tuple[LoadedModel, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    """While prompts prefill, every step carries the running stream's next token and at most the
    budget's tokens, so between two of its tokens the pipeline runs one step."""
    single, _ = pair
    vocab = single.config.vocab_size
    batcher = Batcher(single.pipeline, single.max_context, 16, micro_batches=1)
    steps: list[tuple[int, bool]] = []  # per step: tokens, whether it decodes row 0 (the stream's)
    real = single.pipeline.step

    def step(tokens: torch.Tensor, positions: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        layout: StepLayout | None = kwargs.get("layout")
        if layout is not None:
            decodes = 0 in layout.rows[: layout.decoding]
        else:
            decodes = tokens.shape[1] == 1 and kwargs.get("first_row", 0) == 0
        steps.append((int(tokens.numel()), decodes))
        return real(tokens, positions, *args, **kwargs)

    monkeypatch.setattr(single.pipeline, "step", step)
    got: list[int] = []

    def take(event: TokenEvent) -> bool:
        got.append(event.sample.token)
        return True

    batcher.add(Sequence(GenerationRequest(_prompts(vocab, [4])[0], 40, GREEDY), take, _raise, lambda: False))
    while len(got) < 3:
        batcher.iterate()
    waiting = [GenerationRequest(p, 2, GREEDY) for p in _prompts(vocab, [40, 33, 25], seed=4)]
    for request in waiting:
        batcher.add(Sequence(request, lambda _e: True, _raise, lambda: False))
    start = len(steps)
    while batcher.staging or batcher.queue:
        batcher.iterate()
    during = steps[start:]
    assert len(got) < 40 and during  # the stream ran all along
    assert all(decodes for _, decodes in during), during
    assert max(tokens for tokens, _ in during) <= 16  # the stream's token counted in the budget
    while batcher.active:
        batcher.iterate()
    batcher.drain()


def _raise(error: StagewiseError) -> None:
    raise error
