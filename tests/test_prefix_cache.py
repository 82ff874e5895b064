"""Prefix caching on CPU (virtual devices).

What is compared, exactly (``==`` on (token, log-probability) lists, i.e. bit for bit):

- a request served from the cache, alone, against the same request served cold, alone, on a batcher
  with the cache off — with a prefill chunk (16) that divides the 64-position block, so the cached
  run's suffix chunks start at the same positions as the cold run's chunks (a suffix prefill with other
  chunk boundaries would differ in float rounding, as chunked prefill does); on one device and through
  two stages, attention-only and MoE; hybrids (Gated DeltaNet) with their recurrent state restored
  from a snapshot at a block boundary (chunks of two blocks, cut at block boundaries);
- under preemption and cancellation (a pool too small for every sequence, prompts sharing a prefix):
  two stages = one device for the same schedule, cache on, and every block's state equal; the same
  requests with the cache on and off give the same tokens and log-probabilities within the batch
  tolerance (their schedules differ, and batch composition changes float rounding: test_batching.py);
- the allocator's invariants after every iteration: a block is free, in use or cached-idle, never two;
  no block in use is ever evicted (an evicted block is never one a live sequence holds).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.block_hashes import block_hashes, model_key
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.prefix_cache import OutOfBlocks, PrefixCache
from stagewise.engine.sampling import SamplingParams
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS, KVPool
from tests.batch_runs import run_batch

GREEDY = SamplingParams(temperature=0.0)
CHUNK = 16  # divides the block: cached and cold prefills cut their chunks at the same positions
BATCH_TOLERANCE = 1e-5  # test_batching.py's


# ----- the allocator, alone -------------------------------------------------------------------------
def _keys(ids: list[int]) -> list[bytes]:
    return block_hashes(model_key("m"), ids, KV_BLOCK_TOKENS)


def test_keys_name_the_whole_prefix() -> None:
    a = list(range(200))
    b = [*a[:64], 7, *a[65:]]  # differs in block 1 only
    ka, kb = _keys(a), _keys(b)
    assert len(ka) == 3  # full blocks only
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]  # a later block's key holds the earlier ones
    assert block_hashes(model_key("other"), a, KV_BLOCK_TOKENS)[0] != ka[0]  # and the model


def test_cached_blocks_are_shared_and_evicted_least_recently_used() -> None:
    cache = PrefixCache(KVPool(4, KV_BLOCK_TOKENS, 4))
    first = cache.allocate(2)
    cache.register(first, _keys(list(range(128))))
    cache.release(first)
    assert cache.free_blocks == 4 and cache.cached_blocks == 2 and cache.used_blocks == 0
    hit = cache.lookup(_keys(list(range(128))))
    assert hit.blocks == tuple(first) and hit.idle == 2
    shared = cache.acquire(hit)
    again = cache.acquire(cache.lookup(_keys(list(range(64)))))  # a second reader of block 0
    assert cache.used_blocks == 2 and cache.free_blocks == 2
    cache.release(shared)
    assert cache.used_blocks == 1 and cache.free_blocks == 3  # block 0 still read by the second
    mine = cache.allocate(3)  # the 2 free, then the one idle cached block (block 1): evicted
    assert first[0] not in mine and first[1] in mine and cache.evictions == 1
    assert cache.lookup(_keys(list(range(128)))).blocks == (first[0],)
    with pytest.raises(OutOfBlocks):
        cache.allocate(1)  # block 0 is in use: never evicted
    cache.release(again)
    cache.release(mine)
    cache.check()


def test_random_operations_keep_the_states_apart() -> None:
    rng = random.Random(0)
    cache = PrefixCache(KVPool(12, KV_BLOCK_TOKENS, 12))
    held: list[list[int]] = []
    prefixes = [[rng.randrange(50) for _ in range(4 * KV_BLOCK_TOKENS)] for _ in range(3)]
    for _ in range(2000):
        if held and rng.random() < 0.4:
            cache.release(held.pop(rng.randrange(len(held))))
        else:
            ids = rng.choice(prefixes)[: rng.randrange(1, 4) * KV_BLOCK_TOKENS + rng.randrange(64)]
            keys = _keys(ids)
            hit = cache.lookup(keys)
            need = cache.blocks_for(len(ids)) - len(hit.blocks)
            if need + hit.idle > cache.free_blocks:
                continue
            live = {b for blocks in held for b in blocks}
            blocks = cache.acquire(hit) + cache.allocate(need)
            assert not (set(blocks[len(hit.blocks):]) & live), "a block in use was handed out again"
            cache.register(blocks, keys)
            held.append(blocks)
        cache.check()
        assert cache.used_blocks == len({b for blocks in held for b in blocks})


# ----- through the batcher ----------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["random:tiny-llama", "random:tiny-qwen3-moe"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    single = load_model(request.param, "cpu:1x4GiB", "single", 320, max_seqs=4, prefill_chunk=CHUNK)
    staged = load_model(request.param, "cpu:2x2GiB", "pipeline:2", 320, max_seqs=4, prefill_chunk=CHUNK)
    yield single, staged
    single.close()
    staged.close()


def _shared_prefix_requests(vocab: int, seed: int = 0) -> list[GenerationRequest]:
    """Prompts sharing a 150-token prefix (two full blocks), each with its own ending; one is wholly
    the prefix of two full blocks (its hit is capped at one block: its last token is computed)."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (150,), generator=gen).tolist()
    tails = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (10, 30, 1)]
    prompts = [prefix + tails[0], prefix + tails[1], prefix[:128], prefix[:140] + tails[2]]
    budgets = [12, 20, 8, 70]  # the last crosses a block boundary while decoding
    return [GenerationRequest(tuple(p), n, GREEDY) for p, n in zip(prompts, budgets, strict=True)]


def _one_at_a_time(warm: Batcher, requests: list[GenerationRequest],
                   check: Callable[[], None] | None = None) -> tuple[list[list[tuple[int, float]]], list[int]]:
    """Each request through ``warm`` alone, in order: its tokens and the prompt tokens its cache hit; only
    the rest of each prompt is prefilled."""
    got, hits = [], []
    for request in requests:
        before, prefilled = warm.kv.hit_tokens, warm.prefill_tokens
        out, errors = run_batch(warm, [request])
        assert errors == [None]
        got.append(out[0])
        hits.append(warm.kv.hit_tokens - before)
        assert warm.prefill_tokens - prefilled == len(request.prompt_ids) - hits[-1]  # only the rest ran
        if check is not None:
            check()
    return got, hits


def test_a_cached_request_gives_its_cold_output(pair: tuple[LoadedModel, LoadedModel]) -> None:
    for model in pair:
        requests = _shared_prefix_requests(model.config.vocab_size)
        cold = Batcher(model.pipeline, model.max_context, CHUNK, prefix_cache=False)
        want = [run_batch(cold, [r])[0][0] for r in requests]
        assert cold.kv.hit_tokens == 0
        warm = Batcher(model.pipeline, model.max_context, CHUNK)
        got, hits = _one_at_a_time(warm, requests)
        assert hits == [0, 128, 64, 128]  # two full blocks; a prompt of exactly two blocks hits one
        assert got == want  # tokens and log-probabilities, bit for bit
        assert warm.kv.queried_tokens == sum(len(r.prompt_ids) for r in requests)
        assert warm.kv.prefix_cache is not None
        warm.kv.prefix_cache.check()


def _crowd(vocab: int) -> list[GenerationRequest]:
    """Eight requests over three shared prefixes, on a pool too small for all of them at once."""
    gen = torch.Generator().manual_seed(1)
    prefixes = [torch.randint(0, vocab, (130,), generator=gen).tolist() for _ in range(3)]
    out = []
    for i in range(8):
        tail = torch.randint(0, vocab, (5 + 7 * i,), generator=gen).tolist()
        out.append(GenerationRequest(tuple(prefixes[i % 3] + tail), 30 + 9 * (i % 4), GREEDY))
    return out


def _crowd_run(model: LoadedModel, cache: bool, pool_tokens: int) -> tuple[list[list[tuple[int, float]]], Batcher]:
    batcher = Batcher(model.pipeline, model.max_context, CHUNK, micro_batches=2, prefix_cache=cache)
    assert batcher.pool is not None and batcher.pool.tokens == pool_tokens
    evicted_live: list[int] = []

    def check() -> None:
        cache_ = batcher.kv.prefix_cache
        if cache_ is not None:
            cache_.check()
        live = [s for s in (*batcher.decoding, *batcher.staging) if s is not None and not s.done]
        held = {b for s in live for b in s.blocks}
        assert batcher.used_blocks == len(held)
        assert all(s.row == -1 and not s.blocks for s in batcher.queue)
        evicted_live.extend(b for b in held if cache_ is not None and b in cache_._free)

    out, errors = run_batch(batcher, _crowd(model.config.vocab_size),
                            cancelled=lambda i, n: i == 5 and n >= 4, each_iteration=check)
    assert not evicted_live
    assert [e is None for e in errors] == [i != 5 for i in range(8)]  # the one cancelled, no other
    assert batcher.used_blocks == 0
    return out, batcher


@pytest.fixture(scope="module", params=["random:tiny-llama", "random:tiny-qwen3-moe"])
def tight(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    pool = 7 * KV_BLOCK_TOKENS  # four slots of up to four blocks: preemption, and eviction of cached prefixes
    single = load_model(request.param, "cpu:1x4GiB", "single", 256, max_seqs=4, prefill_chunk=CHUNK, kv_tokens=pool)
    staged = load_model(request.param, "cpu:2x2GiB", "pipeline:2", 256, max_seqs=4, prefill_chunk=CHUNK, kv_tokens=pool)
    yield single, staged
    single.close()
    staged.close()


def test_preemption_and_cancellation_with_the_cache(tight: tuple[LoadedModel, LoadedModel]) -> None:
    single, staged = tight
    pool = 7 * KV_BLOCK_TOKENS
    ours, a = _crowd_run(single, True, pool)
    theirs, b = _crowd_run(staged, True, pool)
    assert ours == theirs  # two stages = one device, bit for bit, for the same schedule
    assert a.preemptions == b.preemptions > 0 and a.kv.hit_tokens == b.kv.hit_tokens > 0
    assert a.kv.prefix_cache is not None and a.kv.prefix_cache.evictions > 0
    cold, c = _crowd_run(single, False, pool)
    assert c.kv.hit_tokens == 0
    for i, (got, want) in enumerate(zip(ours, cold, strict=True)):
        assert [t for t, _ in got] == [t for t, _ in want], i
        if got:
            assert max(abs(x - y) for (_, x), (_, y) in zip(got, want, strict=True)) <= BATCH_TOLERANCE


@pytest.fixture(scope="module")
def hybrid_pair() -> Iterator[tuple[LoadedModel, LoadedModel]]:
    args = dict(context=512, max_seqs=4, prefill_chunk=HYBRID_CHUNK)
    single = load_model("random:tiny-qwen3.6", "cpu:1x4GiB", "single", **args)  # type: ignore[arg-type]
    staged = load_model("random:tiny-qwen3.6", "cpu:2x2GiB", "pipeline:2", **args)  # type: ignore[arg-type]
    yield single, staged
    single.close()
    staged.close()


HYBRID_CHUNK = 128  # two blocks: chunks cut at block boundaries, where snapshots are


def test_a_cached_hybrid_request_gives_its_cold_output(hybrid_pair: tuple[LoadedModel, LoadedModel]) -> None:
    """Gated DeltaNet state is restored from a snapshot taken at a block boundary of an earlier prompt
    (its last full block): the cached request's tokens and log-probabilities are the cold ones, bit for
    bit, on one device and through two stages; a prefix whose end has no snapshot is not a hit."""
    for model in hybrid_pair:
        requests = _shared_prefix_requests(model.config.vocab_size)
        cold = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK, prefix_cache=False)
        assert cold.kv.snapshots is None
        want = [run_batch(cold, [r])[0][0] for r in requests]
        warm = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK)
        store = warm.kv.snapshots
        assert store is not None and store.entries == model.pipeline.snapshot_entries and len(store.entries) == 4
        got, hits = _one_at_a_time(warm, requests, store.check)
        # the first prompt snapshots at 128 (its last full block); 128 tokens alone hit no snapshot at 64
        assert hits == [0, 128, 0, 128]
        assert got == want  # tokens and log-probabilities, bit for bit
        assert len(store) == 2  # at 128 (the first prompt's last full block), at 64 (where the third leaves the cached blocks)


def test_hybrid_agents_sharing_a_system_prompt_hit_where_they_part(
        hybrid_pair: tuple[LoadedModel, LoadedModel]) -> None:
    """Prompts sharing a 260-token system prompt (four full blocks), each with its own question: the
    first snapshots only at its own last full block (320); the second finds the shared blocks cached
    but no snapshot at their end, so it starts cold and snapshots there (256); the third starts from
    it, with its cold output (bit for bit: its chunks start where the cold ones do, at 256)."""
    single, _ = hybrid_pair
    gen = torch.Generator().manual_seed(9)
    vocab = single.config.vocab_size
    system = torch.randint(0, vocab, (260,), generator=gen).tolist()
    requests = [GenerationRequest(tuple(system + torch.randint(0, vocab, (70,), generator=gen).tolist()), 6, GREEDY)
                for _ in range(3)]
    cold = Batcher(single.pipeline, single.max_context, HYBRID_CHUNK, prefix_cache=False)
    want = [run_batch(cold, [r])[0][0] for r in requests]
    warm = Batcher(single.pipeline, single.max_context, HYBRID_CHUNK)
    hits = []
    for request, expected in zip(requests, want, strict=True):
        before = warm.kv.hit_tokens
        out, errors = run_batch(warm, [request])
        assert errors == [None] and out[0] == expected
        hits.append(warm.kv.hit_tokens - before)
    assert hits == [0, 0, 256]


def test_hybrid_snapshots_are_evicted_least_recently_used(hybrid_pair: tuple[LoadedModel, LoadedModel]) -> None:
    """More distinct prefixes than snapshot entries (four): the least recently used snapshots are
    evicted, the store's entries stay partitioned, and a prefix still cached is a hit that gives the
    cold output bit for bit (each request alone: the same chunks as cold)."""
    single, _ = hybrid_pair
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, single.config.vocab_size, (130 + i,), generator=gen).tolist() for i in range(6)]
    requests = [GenerationRequest(tuple(p), 4, GREEDY) for p in prompts]
    cold = Batcher(single.pipeline, single.max_context, HYBRID_CHUNK, prefix_cache=False)
    want = [run_batch(cold, [r])[0][0] for r in requests]
    warm = Batcher(single.pipeline, single.max_context, HYBRID_CHUNK)
    store = warm.kv.snapshots
    assert store is not None
    for request in requests:
        _, errors = run_batch(warm, [request])
        assert errors == [None]
        store.check()
    assert store.evictions == 2 and len(store) == 4 and warm.kv.hit_tokens == 0
    first, _ = run_batch(warm, requests[:1])  # evicted: no hit (the KV blocks alone are not enough)
    assert warm.kv.hit_tokens == 0 and first[0] == want[0]
    last, _ = run_batch(warm, requests[-1:])  # still cached: a hit, the cold output
    assert warm.kv.hit_tokens == 128 and last[0] == want[-1]


def test_a_budget_below_a_block_keeps_hybrids_uncached() -> None:
    model = load_model("random:tiny-qwen3.6", "cpu:1x4GiB", "single", 256, max_seqs=2, prefill_chunk=CHUNK)
    try:
        batcher = Batcher(model.pipeline, model.max_context, CHUNK)
        assert batcher.kv.prefix_cache is None  # chunks of 16 never stop at a snapshot as a cold prompt does
        requests = _shared_prefix_requests(model.config.vocab_size)[:2]
        _, errors = run_batch(batcher, requests)
        assert errors == [None, None] and batcher.kv.hit_tokens == 0
    finally:
        model.close()


def test_a_hybrid_crowd_with_preemption_gives_its_cold_tokens() -> None:
    """Eight requests over three shared prefixes, twice, on a pool too small for them all (preemption)
    with four snapshot entries (eviction): the second pass restores snapshots while other rows decode,
    join and are preempted beside it; every token is the cold run's (log-probabilities within the
    batching tolerance: the steps are grouped differently), no request fails."""
    pool = 7 * KV_BLOCK_TOKENS
    model = load_model("random:tiny-qwen3.6", "cpu:1x4GiB", "single", 256, max_seqs=4, prefill_chunk=HYBRID_CHUNK,
                       kv_tokens=pool)
    try:
        requests = _crowd(model.config.vocab_size)
        cold = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK, micro_batches=2, prefix_cache=False)
        want, errors = run_batch(cold, requests)
        assert errors == [None] * len(requests) and cold.preemptions > 0
        warm = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK, micro_batches=2)
        store = warm.kv.snapshots
        assert store is not None
        for _ in range(2):
            got, errors = run_batch(warm, requests, each_iteration=store.check)
            assert errors == [None] * len(requests)
            for i, (ours, theirs) in enumerate(zip(got, want, strict=True)):
                assert [t for t, _ in ours] == [t for t, _ in theirs], i
                assert max(abs(x - y) for (_, x), (_, y) in zip(ours, theirs, strict=True)) <= BATCH_TOLERANCE
        assert warm.preemptions > 0 and warm.kv.hit_tokens > 0 and store.evictions > 0
    finally:
        model.close()


@pytest.mark.parametrize("name", ["random:tiny-llama", "random:tiny-qwen3.6"])
def test_agents_sent_at_once_compute_their_shared_prompt_once(name: str) -> None:
    """Four prompts sharing a 260-token system prompt, each with its own question, sent at once: the
    first prefills, the others wait for it (their shared blocks, four, are computed once, and for the
    hybrid the first snapshots where they part) and start from the cache; every token is the one each
    request gives alone and uncached (log-probabilities within the batching tolerance)."""
    model = load_model(name, "cpu:1x4GiB", "single", 512, max_seqs=4, prefill_chunk=HYBRID_CHUNK)
    try:
        gen = torch.Generator().manual_seed(11)
        vocab = model.config.vocab_size
        system = torch.randint(0, vocab, (260,), generator=gen).tolist()
        requests = [GenerationRequest(tuple(system + torch.randint(0, vocab, (40 + 9 * i,), generator=gen).tolist()),
                                      6, GREEDY) for i in range(4)]
        cold = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK, prefix_cache=False)
        want = [run_batch(cold, [r])[0][0] for r in requests]
        warm = Batcher(model.pipeline, model.max_context, HYBRID_CHUNK)
        got, errors = run_batch(warm, requests)
        assert errors == [None] * 4
        assert warm.kv.hit_tokens == 3 * 256  # three followers, four shared blocks each
        assert warm.prefill_tokens == sum(len(r.prompt_ids) for r in requests) - 3 * 256
        for ours, theirs in zip(got, want, strict=True):
            assert [t for t, _ in ours] == [t for t, _ in theirs]
            assert max(abs(x - y) for (_, x), (_, y) in zip(ours, theirs, strict=True)) <= BATCH_TOLERANCE
    finally:
        model.close()
