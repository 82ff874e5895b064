"""After warm-up, serving compiles and captures nothing new: a mixed workload of random prompt lengths, row
counts, context lengths and sampling adds no Triton kernel specialization (as Triton keys them:
:class:`~stagewise.kernels.kernel_variants.VariantLog`, the kernels run by the interpreter) and no decode
graph key (a CPU stand-in records the keys a GPU stage would capture: ``tests/step_graph_keys.py``); the
decode graphs warm-up captures (and the planner charges) are one per launchable shape, whatever the context."""

from __future__ import annotations

import random

import pytest
import torch

from stagewise.engine.batcher import Batcher
from stagewise.engine.decode_groups import plan_groups
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.engine.sequence import Sequence
from stagewise.engine.warm_up import packed_token_counts, warm_up
from stagewise.errors import StagewiseError
from stagewise.kernels.kernel_variants import VariantLog, compiled_variants
from stagewise.kernels.silu_mul_triton import _silu_mul_kernel, silu_mul
from stagewise.kernels.triton_launch import kernels_on_host
from stagewise.runtime.step_graphs import graph_lengths, kv_buckets
from stagewise.spec.profile import Profile
from stagewise.spec.workspace_bytes import batch_buckets, graph_output_bytes
from tests.step_graph_keys import record_graph_keys

CONTEXT = 512  # two attended-length buckets on the reference path (256 and 512), one graph a shape here
PREFILL_CHUNK = 8


def _raise(error: StagewiseError) -> None:
    raise error


def _serve(batcher: Batcher, requests: list[GenerationRequest]) -> int:
    """Run ``requests`` to completion (those past the free rows queue); returns the tokens they produced."""
    tokens: list[int] = []
    for req in requests:
        batcher.add(Sequence(req, lambda e: tokens.append(e.sample.token) is None, _raise, lambda: False))
    while batcher.active:
        batcher.iterate()
    batcher.drain()
    return len(tokens)


def _workload(rng: random.Random, batcher: Batcher, vocab_size: int) -> list[GenerationRequest]:
    """One burst: 1 .. slots + 1 requests of random prompt lengths (up to the context, so that decode steps
    reach every bucket), lengths out and sampling (greedy, or sampled on the host with log-probabilities)."""
    burst = []
    for _ in range(rng.randint(1, batcher.slots + 1)):
        length = rng.choice([rng.randint(1, 2 * PREFILL_CHUNK + 3), rng.randint(1, batcher.sequence_tokens - 8)])
        out = rng.randint(1, min(6, batcher.sequence_tokens - length))
        prompt = tuple(rng.randrange(1, vocab_size) for _ in range(length))
        if rng.random() < 0.7:
            burst.append(GenerationRequest(prompt, out, SamplingParams(temperature=0.0)))
        else:
            burst.append(GenerationRequest(prompt, out, SamplingParams(temperature=0.8, seed=rng.randrange(99)),
                                           top_logprobs=rng.randint(0, 2)))
    return burst


@pytest.mark.slow  # minutes: every kernel through Triton's interpreter
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.6"])
def test_nothing_compiles_or_captures_after_warm_up(preset: str) -> None:
    loaded = load_model(f"random:{preset}", devices="cpu:1x1GiB", placement="single", context=CONTEXT, max_seqs=2,
                        prefill_chunk=PREFILL_CHUNK)
    try:
        graphs = record_graph_keys(loaded.pipeline)
        batcher = Batcher(loaded.pipeline, loaded.max_context, PREFILL_CHUNK)
        assert batcher.graphs  # decode groups padded to graph buckets, as on a GPU
        vocab = loaded.config.vocab_size
        with kernels_on_host(), VariantLog() as log:
            done = warm_up(batcher, vocab)
            assert done.graph_lengths == (CONTEXT,)  # decode attention reads each row's length on the device
            assert done.packed_tokens == packed_token_counts(PREFILL_CHUNK) == (1, 2, 3, 4, 5, 7, 8)
            want = {(first, run, CONTEXT) for first, run in done.launchable_shapes}
            assert done.graph_keys == want
            assert {(first, run, length) for first, run, _, length in graphs[0].captured} == want
            warm_variants, warm_keys, warm_launches = set(log.variants), list(graphs[0].captured), log.launches
            assert warm_variants and warm_launches
            rng = random.Random(47)
            produced = sum(_serve(batcher, _workload(rng, batcher, vocab)) for _ in range(4))
            assert produced > 0 and log.launches > warm_launches  # the workload ran kernels
            new = sorted(log.variants - warm_variants, key=lambda v: (v.kernel, v.key))
            assert not new, "kernel specializations compiled after warm-up:\n" + "\n".join(f"{v.kernel} {v.key}" for v in new)
            assert graphs[0].captured == warm_keys, "decode graphs captured after warm-up"
    finally:
        loaded.close()


def test_variant_log_keys_launches_as_triton_specializes_them() -> None:
    """The log tells apart what Triton compiles apart (an integer of another class: 1, a multiple of 16,
    other; a misaligned pointer; another constexpr) and nothing else (the grid); on a GPU, Triton's cache
    then holds one kernel per logged variant."""
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def gate_up(rows: int, width: int, offset: int = 0) -> torch.Tensor:
        return torch.randn(rows * 2 * width + offset, device=device)[offset:].view(rows, 2 * width)

    if device == "cuda":
        _silu_mul_kernel.device_caches.clear()  # type: ignore[attr-defined]  # a JIT function's compiled kernels
    with kernels_on_host(), VariantLog() as log:
        silu_mul(gate_up(3, 16))
        silu_mul(gate_up(5, 16))  # another grid only
        assert len(log.variants) == 1 and log.launches == 2
        silu_mul(gate_up(3, 17))  # width and row stride not multiples of 16; BLOCK 32
        silu_mul(gate_up(3, 19))  # the same classes
        assert len(log.variants) == 2
        silu_mul(gate_up(3, 1))  # width 1: a constant
        silu_mul(gate_up(3, 16, offset=1))  # a misaligned input
        assert len(log.variants) == 4
    if device == "cuda":
        assert compiled_variants() >= 4
        assert sum(len(c[0]) for c in _silu_mul_kernel.device_caches.values()) == 4  # type: ignore[attr-defined]
    silu_mul(gate_up(3, 48))
    assert log.launches == 6  # closed: nothing more recorded


@pytest.mark.parametrize("slots", [1, 2, 5, 9, 12, 17, 64, 100])
def test_the_charge_counts_every_decode_graph_warm_up_captures(slots: int) -> None:
    """The planner charges graph outputs for the decode row counts that one decode group launches (what
    warm-up captures: one graph each, whatever the context), no fewer."""
    runs = {run for count in range(1, slots + 1)
            for _, _, run in plan_groups(count, 1, True, slots - 1 if count < slots else slots)}
    assert batch_buckets(slots) == sorted(runs)
    for context in (64, 256, 300, 1024, 5000, 16384, 131072):
        assert graph_lengths(context, context) == (context,)


def test_decode_graphs_warm_up_captures_do_not_grow_with_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warm-up captures one decode graph per launchable shape at a short and at an 8x longer context (each
    step's attended length is the context: every length replays it), and the planner charges the same
    graph outputs for both; the reference path's graphs (a bucket each) would grow: 2 buckets, then 6."""
    captured = []
    for context in (512, 4096):
        loaded = load_model("random:tiny-llama", devices="cpu:1x1GiB", placement="single", context=context,
                            max_seqs=3, prefill_chunk=PREFILL_CHUNK)
        try:
            graphs = record_graph_keys(loaded.pipeline)
            batcher = Batcher(loaded.pipeline, loaded.max_context, PREFILL_CHUNK)
            done = warm_up(batcher, loaded.config.vocab_size)
            assert done.graph_lengths == (context,)
            assert done.graph_keys == {(first, run, context) for first, run in done.launchable_shapes}
            assert f"a graph each for every attended length up to {context:,}" in done.summary()
            captured.append(len(graphs[0].captured))
            assert loaded.spec is not None
            profile = Profile(context_tokens=context, batch=3, kernel_path="triton")
            charged = graph_output_bytes(loaded.spec, profile, exit=True)
            assert charged == sum(batch_buckets(3)) * (loaded.config.vocab_size * 4 + loaded.config.hidden_size * 2)
        finally:
            loaded.close()
    assert captured[0] == captured[1] == len(done.launchable_shapes)
    monkeypatch.setenv("STAGEWISE_KERNELS", "torch")  # the reference path masks an extent: a graph per bucket
    assert graph_lengths(512, 512) == kv_buckets(512, 512) == (256, 512)
    assert len(graph_lengths(4096, 4096)) == 6


@pytest.mark.slow  # a minute and a half: 64 MoE steps through Triton's interpreter
def test_warm_up_token_counts_launch_every_moe_variant_a_prompt_can() -> None:
    # a MoE layer's kernels specialize on the routed slot count (tokens x top_k) and the alignment's
    # blocks, whose classes differ from the token count's: the counts warm-up prefills must launch every
    # variant a packed step of any count up to the chunk launches (2 were missed at a 64-token chunk)
    from stagewise.engine.warm_up import launch_classes
    from stagewise.models.layers.moe import SparseMoE

    chunk = 64
    loaded = load_model("random:tiny-qwen3-moe", devices="cpu:1x1GiB", placement="single", context=256, max_seqs=2,
                        prefill_chunk=chunk)
    try:
        batcher = Batcher(loaded.pipeline, loaded.max_context, chunk)
        classes = launch_classes(batcher)
        assert classes is not None
        counts = packed_token_counts(chunk, classes)
        assert set(packed_token_counts(chunk)) < set(counts)  # the slot classes add counts
        moe = next(m for m in loaded.pipeline.stages[0].model.modules() if isinstance(m, SparseMoE))
        hidden = loaded.config.hidden_size
        gen = torch.Generator().manual_seed(0)

        def variants(ns: range | tuple[int, ...]) -> set[object]:
            with kernels_on_host(), VariantLog() as log:
                for n in ns:
                    moe(torch.randn(n, hidden, generator=gen))
            return {v for v in log.variants if "moe" in v.kernel or "grouped" in v.kernel}

        assert variants(range(1, chunk + 1)) == variants(counts)
    finally:
        loaded.close()


def test_bucket_prompts_make_one_step_of_the_bucket_whatever_cuts_a_prompt() -> None:
    from stagewise.engine.warm_up import bucket_prompts

    assert bucket_prompts(24, 64) == (24,)  # no whole block: never cut
    assert bucket_prompts(384, 64, 1024) == (384,)  # whole blocks: its last whole block is its end
    assert bucket_prompts(96, 64) == (64, 32)  # a prompt of 96 would be cut at 64
    assert bucket_prompts(384, 64, 128) == (128, 128, 128)  # a snapshot every 2 blocks
    assert bucket_prompts(200, 64, 128) == (128, 64, 8)


def test_warm_up_captures_every_packed_bucket_of_a_hybrid_with_prefix_snapshots() -> None:
    """A hybrid with the prefix cache cuts a prompt at its last whole KV block (its snapshot): the prompt lengths
    of the packed-step sweep (2^k + 1) then never made a step of 129-192 or 257-384 tokens, whose pieces the
    first burst captured (2 of 11 buckets at a 512-token chunk). Packed graphs run eagerly on the host (their
    "capture" records the bucket), as a GPU stage's would be captured."""
    from stagewise.runtime.packed_graphs import PackedGraphs

    loaded = load_model("random:tiny-qwen3.6", devices="cpu:1x1GiB", placement="single", context=2048, max_seqs=4)
    try:
        for stage in loaded.pipeline.stages:
            assert stage.states is not None
            stage.packed = PackedGraphs(stage.model, stage.states, stage.device, loaded.prefill_chunk, stage.dtype)
        batcher = Batcher(loaded.pipeline, loaded.max_context, loaded.prefill_chunk)
        assert batcher.kv.snapshots is not None and loaded.prefill_chunk == 512
        done = warm_up(batcher, loaded.config.vocab_size)
        buckets = loaded.pipeline.stages[0].packed.buckets
        assert {192, 384} <= set(buckets)
        assert done.packed_buckets == buckets and done.packed_bucket_count == len(buckets)
    finally:
        loaded.close()
