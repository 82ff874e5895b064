"""Paged KV cache on CPU: block tables that are not the identity compute the same logits bit for bit,
a pool too small for every sequence at once preempts and recomputes without changing any output,
staged = single under the same preemptions, the allocator never shares a block, and a prompt larger
than the pool is refused at admission."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.prefix_cache import OutOfBlocks, PrefixCache
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.errors import ContextLengthExceeded, StagewiseError
from stagewise.models.kv_cache import KVCache
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, KVPool
from tests.batch_runs import Run, run_batch
from tests.staged import run_trace

GREEDY = SamplingParams(temperature=0.0)
CONTEXT = 256  # four 64-position blocks per sequence slot
POOL_TOKENS = 5 * KV_BLOCK_TOKENS  # five blocks for four slots: not every sequence at once


def _prompts(vocab: int, lengths: list[int], seed: int = 0) -> list[tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]


def _requests(vocab: int) -> list[GenerationRequest]:
    # lengths that cross block boundaries while decoding: 6 sequences of 1-3 blocks on a 5-block pool
    prompts = _prompts(vocab, [60, 20, 100, 5, 70, 30])
    budgets = [40, 60, 30, 70, 20, 45]
    return [GenerationRequest(p, n, GREEDY) for p, n in zip(prompts, budgets, strict=True)]


def _check_blocks(batcher: Batcher) -> None:
    """The allocator's invariants: live sequences own disjoint blocks, the allocator counts exactly
    those, and every live row's block-table row names them (then scratch) on every stage."""
    assert batcher.kv.allocator is not None and batcher.pool is not None
    live = [s for s in (*batcher.decoding, *batcher.staging) if s is not None and not s.done]
    owned = [b for s in live for b in s.blocks]
    assert len(owned) == len(set(owned)), "a block in two sequences"
    assert len(owned) == batcher.kv.allocator.used_blocks
    assert all(s.row == -1 and not s.blocks for s in batcher.queue)
    for stage in batcher.pipeline.stages:
        table = stage.block_table
        assert table is not None
        for s in live:
            row = table.host_row(s.row)
            assert row[: len(s.blocks)] == s.blocks and set(row[len(s.blocks):]) <= {table.scratch}


def _run(batcher: Batcher, requests: list[GenerationRequest], check: bool = False) -> tuple[Run, list[StagewiseError | None]]:
    """``run_batch``, checking the blocks after every iteration (``check``) and that all are back at the end."""
    out, errors = run_batch(batcher, requests, each_iteration=(lambda: _check_blocks(batcher)) if check else None)
    if batcher.kv.allocator is not None:
        assert batcher.kv.allocator.used_blocks == 0  # every block back when the sequences end
    return out, errors


def _load(preset: str, staged: bool = False, kv_tokens: int | None = POOL_TOKENS) -> LoadedModel:
    if staged:
        return load_model(preset, "cpu:2x2GiB", "pipeline:2", CONTEXT, max_seqs=4, prefill_chunk=32, kv_tokens=kv_tokens)
    return load_model(preset, "cpu:1x4GiB", "single", CONTEXT, max_seqs=4, prefill_chunk=32, kv_tokens=kv_tokens)  # CPU, as staged


@pytest.fixture(scope="module", params=["random:tiny-llama", "random:tiny-qwen3.5"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    single, staged = _load(request.param), _load(request.param, staged=True)
    yield single, staged
    single.close()
    staged.close()


def test_preempted_sequences_give_their_alone_outputs(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    requests = _requests(single.config.vocab_size)
    batcher = Batcher(single.pipeline, single.max_context, 32)
    together, errors = _run(batcher, requests, check=True)
    assert errors == [None] * len(requests)
    assert batcher.preemptions > 0  # the pool is too small for them all: some were recomputed
    for request, got in zip(requests, together, strict=True):
        alone, _ = _run(Batcher(single.pipeline, single.max_context, 32), [request])
        assert [t for t, _ in got] == [t for t, _ in alone[0]]  # the same tokens
        assert len(got) == request.max_tokens
        assert max(abs(x - y) for (_, x), (_, y) in zip(got, alone[0], strict=True)) <= 1e-5


def test_staged_equals_single_under_preemption(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, staged = pair
    requests = _requests(single.config.vocab_size)
    a, b = (Batcher(m.pipeline, m.max_context, 32, micro_batches=2) for m in (single, staged))
    ours, _ = _run(a, requests)
    theirs, _ = _run(b, requests)
    assert ours == theirs  # tokens and log-probabilities, exactly
    assert a.preemptions == b.preemptions > 0
    states = [{(i, name): t for stage in m.pipeline.stages for i, s in stage.states.items()
               for name, t in s.tensors().items()} for m in (single, staged)]  # KV read through the tables
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_seeded_sampling_survives_preemption(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    vocab = single.config.vocab_size
    seeded = GenerationRequest(_prompts(vocab, [90], seed=5)[0], 60, SamplingParams(temperature=0.9, seed=7))
    alone, _ = _run(Batcher(single.pipeline, single.max_context, 32), [seeded])
    batcher = Batcher(single.pipeline, single.max_context, 32)
    crowd, _ = _run(batcher, [*_requests(vocab)[:3], seeded])
    assert batcher.preemptions > 0
    assert [t for t, _ in crowd[-1]] == [t for t, _ in alone[0]]


def test_a_prompt_larger_than_the_pool_is_refused() -> None:
    model = load_model("random:tiny-llama", None, "single", CONTEXT, max_seqs=2, kv_tokens=2 * KV_BLOCK_TOKENS)
    try:
        batcher = Batcher(model.pipeline, model.max_context, 32)
        assert batcher.pool is not None and batcher.pool.blocks == 2
        with pytest.raises(ContextLengthExceeded, match="KV pool holds 2 blocks"):
            batcher.add(Sequence(GenerationRequest(tuple(range(1, 129)), 4, GREEDY), lambda e: True, print,
                                 lambda: False))
        fits = GenerationRequest(tuple(range(1, 121)), 50, GREEDY)  # 120 tokens: its budget stops at the pool
        out, errors = _run(batcher, [fits])
        assert errors == [None] and len(out[0]) == 2 * KV_BLOCK_TOKENS - 120
    finally:
        model.close()


def test_scrambled_block_table_gives_identical_logits() -> None:
    model = _load("random:tiny-llama", kv_tokens=None)
    try:
        prompt = list(_prompts(model.config.vocab_size, [150])[0])
        identity = run_trace(model.pipeline, prompt, chunk=32, decode_steps=40)  # crosses into a third block
        assert model.pipeline.stages[0].block_table.host_row(0) == [0, 1, 2, 3]  # type: ignore[union-attr]
        model.pipeline.set_blocks(0, [13, 2, 9, 6])  # not in order, not contiguous, not row 0's own
        scrambled = run_trace(model.pipeline, prompt, chunk=32, decode_steps=40)
        assert scrambled.tokens == identity.tokens
        assert all(torch.equal(a, b) for a, b in zip(identity.logits, scrambled.logits, strict=True))
        for key, want in identity.states.items():
            if key.endswith((".key", ".value")):
                assert torch.equal(scrambled.states[key][0], want[0]), key  # row 0 read through its table
        cache = model.pipeline.stages[0].states[0]
        assert isinstance(cache, KVCache)
        # and the keys really sit in the scrambled blocks: block 13 holds row 0's positions 0..63
        assert torch.equal(cache.key[13], scrambled.states["0.key"][0, :, :KV_BLOCK_TOKENS])
    finally:
        model.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=60))
def test_allocator_never_hands_out_a_block_twice(ops: list[tuple[bool, int]]) -> None:
    allocator = PrefixCache(KVPool(blocks=12, block_tokens=KV_BLOCK_TOKENS, blocks_per_row=4))
    owners: list[list[int]] = []
    for grow, n in ops:
        if grow:
            if n > allocator.free_blocks:
                with pytest.raises(OutOfBlocks):
                    allocator.allocate(n)
                continue
            owners.append(allocator.allocate(n))
        elif owners:
            allocator.release(owners.pop(n % len(owners)))
        held = [b for ids in owners for b in ids]
        assert len(held) == len(set(held)) == allocator.used_blocks
        assert allocator.used_blocks + allocator.free_blocks == 12
    for ids in owners:
        allocator.release(ids)
    assert allocator.free_blocks == 12
    with pytest.raises(ValueError):
        allocator.release([0])  # a double free is refused


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", ["random:tiny-llama", "random:tiny-qwen3.6"])
def test_preemption_on_the_gpu_with_graphs_and_paged_kernels(preset: str) -> None:
    """The Triton path (rope_store through the table, paged decode attention) under CUDA graphs, with
    a pool too small for every sequence: alone = together, and (with two GPUs) two stages = one, bit for bit."""
    runs = []
    layouts = [("cuda:0", "single")] + ([("cuda:0,cuda:1", "pipeline:2")] if torch.cuda.device_count() > 1 else [])
    for devices, placement in layouts:
        model = load_model(preset, devices, placement, CONTEXT, dtype="float32", max_seqs=4, prefill_chunk=32,
                           kv_tokens=POOL_TOKENS)
        try:
            requests = _requests(model.config.vocab_size)
            batcher = Batcher(model.pipeline, model.max_context, 32, micro_batches=2)
            together, errors = _run(batcher, requests, check=True)
            assert errors == [None] * len(requests) and batcher.preemptions > 0
            if placement == "single":
                for request, got in zip(requests, together, strict=True):
                    alone, _ = _run(Batcher(model.pipeline, model.max_context, 32), [request])
                    assert [t for t, _ in got] == [t for t, _ in alone[0]]
            runs.append(together)
        finally:
            model.close()
    assert all(run == runs[0] for run in runs)


def test_engine_counts_preemptions_and_blocks(tmp_path: Path) -> None:
    from stagewise.engine.engine import Engine
    from stagewise.engine.request import EngineRequest
    from stagewise.engine.request_output import RequestOutput
    from tests.test_server_support import make_model_dir

    model = load_model(str(make_model_dir(tmp_path)), None, "single", CONTEXT, max_seqs=4, kv_tokens=POOL_TOKENS,
                       prefill_chunk=32)
    engine = Engine(model, max_waiting=8).start()
    try:
        prompts = _prompts(model.config.vocab_size, [60, 100, 70, 90], seed=2)
        requests = [EngineRequest(f"r{i}", p, 60, GREEDY) for i, p in enumerate(prompts)]

        def text(outputs: queue.Queue[RequestOutput]) -> str:
            return "".join(outputs.get().text for _ in range(outputs.qsize()))

        sinks: list[queue.Queue[RequestOutput]] = [queue.Queue() for _ in requests]
        handles = [engine.submit(r, sink.put) for r, sink in zip(requests, sinks, strict=True)]
        assert all(h.wait(60) for h in handles)
        together = [text(s) for s in sinks]
        assert engine.metrics.preemptions._value.get() > 0
        assert b"stagewise_preemptions_total" in engine.metrics.render()
        in_use = engine.metrics.stage_kv_blocks_in_use.labels("0", model.pipeline.stages[0].spec.device)
        deadline = time.monotonic() + 5  # the engine reports after the iteration that ended them
        while in_use._value.get() != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert in_use._value.get() == 0  # every block back
        for request, want in zip(requests, together, strict=True):
            sink: queue.Queue[RequestOutput] = queue.Queue()
            assert engine.submit(request, sink.put).wait(60)
            assert text(sink) == want  # alone: the same text
    finally:
        engine.stop()
        model.close()


def _poison(model: LoadedModel) -> None:
    """Fill what no fresh sequence may read with NaN: every KV pool (blocks a freed sequence left, or
    never written) and every recurrent-state entry but the zero entry (rows' own and snapshots)."""
    for stage in model.pipeline.stages:
        assert stage.states is not None
        for state in stage.states.blocks.values():
            pools = getattr(state, "pools", None)
            if pools is not None:
                for pool in pools.values():
                    pool[1:].fill_(float("nan"))  # entry 0 is the zero entry fresh sequences read
            else:
                assert isinstance(state, KVCache)
                state.key.fill_(float("nan"))
                state.value.fill_(float("nan"))


@pytest.mark.parametrize("path", ["torch", "triton"])
@pytest.mark.parametrize("preset", ["random:tiny-llama", "random:tiny-qwen3.6"])
def test_stale_pool_contents_never_reach_a_sequence(preset: str, path: str) -> None:
    # what a sequence has not written (a freed sequence's blocks and state, positions past its own in a
    # block) weighs nothing: a NaN there (left by a sequence whose model overflowed) must not fail or
    # change any other sequence, on the reference path (masked keys' values are zeroed before the
    # weighted sum: 0 x NaN is NaN) and on the kernels' (masked loads)
    from stagewise.kernels.triton_launch import kernels_on_host

    with kernels_on_host() if path == "triton" else contextlib.nullcontext():
        model = _load(preset, kv_tokens=None)
        # two sequences, one crossing a block boundary while it decodes: the interpreter is slow
        prompts = _prompts(model.config.vocab_size, [60, 20])
        requests = [GenerationRequest(p, 8, GREEDY) for p in prompts]
        clean, clean_errors = _run(Batcher(model.pipeline, model.max_context, 32), requests)
        _poison(model)
        poisoned, errors = _run(Batcher(model.pipeline, model.max_context, 32), requests)
        model.close()
    assert clean_errors == errors == [None] * len(requests)
    assert poisoned == clean  # the same tokens and log-probabilities, bit for bit
