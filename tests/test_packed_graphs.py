"""Packed steps cut at the mixers (PackedGraphs): padded to a token bucket, the token-by-token pieces between
the mixers, the mixers over the real tokens, static buffers shared by the blocks. On the CPU a piece's replay
runs it again (no capture), so what is checked here is the cutting: the same logits and state as the eager
step, over steps that reuse a bucket and its buffers, and staged = single bit for bit."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator

import pytest
import torch

from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.kernels.triton_launch import kernels_on_host
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.packed_graphs import PackedGraphs, token_bucket, token_buckets
from stagewise.runtime.pipeline import Pipeline
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS

PRESETS = ["random:tiny-llama", "random:tiny-qwen3-moe", "random:tiny-qwen3.6"]
MAX_TOKENS = 40  # buckets 16, 24, 32, 48
needs_kernels = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                   reason="Triton kernels need a GPU or TRITON_INTERPRET=1")


def _kernels(request: pytest.FixtureRequest, kernels: bool) -> contextlib.AbstractContextManager[None]:
    """The kernels' path (Triton's interpreter on the CPU) for the hybrid only, whose blocks cover every
    mixer and the MoE (minutes through the interpreter); the torch path for every preset."""
    if kernels and request.node.callspec.params["models"] != "random:tiny-qwen3.6":
        pytest.skip("the kernels' path runs for the hybrid preset")
    return kernels_on_host() if kernels else contextlib.nullcontext()


def test_token_buckets() -> None:
    assert token_buckets(40) == (16, 24, 32, 48)
    assert token_buckets(512) == (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    assert token_buckets(600)[-2:] == (512, 608)  # the last: the most a step carries, rounded up to 16
    assert token_buckets(1) == (16,)
    buckets = token_buckets(2048)
    assert all(b % 8 == 0 for b in buckets) and list(buckets) == sorted(set(buckets))
    assert all(2 * b <= 3 * a for a, b in itertools.pairwise(buckets))  # at most a third of a bucket is padding
    assert token_bucket(17, buckets) == 24 and token_bucket(48, buckets) == 48 and token_bucket(2049, buckets) is None


@pytest.fixture(scope="module", params=PRESETS)
def models(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    single = load_model(request.param, "cpu:1x4GiB", "single", 96, max_seqs=4, prefill_chunk=16)
    staged = load_model(request.param, "cpu:2x2GiB", "pipeline:2", 96, max_seqs=4, prefill_chunk=16)
    yield single, staged
    single.close()
    staged.close()


def _pieces(pipeline: Pipeline, on: bool) -> None:
    for stage in pipeline.stages:
        assert stage.states is not None
        stage.packed = PackedGraphs(stage.model, stage.states, stage.device, MAX_TOKENS, stage.dtype) if on else None


def _ids(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _steps(vocab: int) -> list[tuple[StepLayout, torch.Tensor]]:
    """Three packed steps over rows 0-2: two prompts; a decoding row beside the rest of a prompt and a
    third prompt (the same bucket as the first step, 21 tokens); every row decoding (a smaller bucket)."""
    first = StepLayout(rows=(0, 1), starts=(0, 0), lengths=(12, 9), logits=(0,), decoding=0)
    second = StepLayout(rows=(0, 1, 2), starts=(12, 9, 0), lengths=(1, 7, 13), logits=(0, 1, 2), decoding=1)
    third = StepLayout(rows=(0, 1, 2), starts=(13, 16, 13), lengths=(1, 1, 1), logits=(0, 1, 2), decoding=3)
    return [(layout, _ids(vocab, layout.tokens, seed)[:, None]) for seed, layout in enumerate((first, second, third))]


Run = tuple[list[torch.Tensor], dict[tuple[int, str], torch.Tensor]]


def _states(pipeline: Pipeline) -> dict[tuple[int, str], torch.Tensor]:
    return {(index, name): tensor.to("cpu", copy=True) for stage in pipeline.stages
            for index, state in stage.states.items() for name, tensor in state.tensors().items()}


def _run(pipeline: Pipeline, vocab: int) -> Run:
    """Every step's logits and every block's state after them, on the host."""
    for row in range(pipeline.rows):
        pipeline.reset(row)
    logits = []
    for layout, tokens in _steps(vocab):
        out = pipeline.step(tokens, torch.tensor(layout.positions())[:, None], layout=layout).logits
        assert out is not None
        logits.append(out.cpu())
    return logits, _states(pipeline)


def _same(a: Run, b: Run) -> bool:
    """The same logits and state, bit for bit."""
    return (all(torch.equal(x, y) for x, y in zip(a[0], b[0], strict=True)) and a[1].keys() == b[1].keys()
            and all(torch.equal(a[1][k], b[1][k]) for k in a[1]))


@pytest.mark.parametrize("kernels", [False, pytest.param(True, marks=needs_kernels)], ids=["torch", "triton"])
def test_pieces_give_the_eager_step(models: tuple[LoadedModel, LoadedModel], kernels: bool,
                                    request: pytest.FixtureRequest) -> None:
    single, _ = models
    pipeline, vocab = single.pipeline, single.config.vocab_size
    with _kernels(request, kernels):
        _pieces(pipeline, False)
        want, want_states = _run(pipeline, vocab)
        _pieces(pipeline, True)
        got, got_states = _run(pipeline, vocab)
    packed = pipeline.stages[0].packed
    assert packed is not None and sorted(packed.graphs) == [16, 24]  # the second step reused the first's bucket
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    for key, tensor in want_states.items():
        torch.testing.assert_close(got_states[key], tensor, atol=1e-5, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    _pieces(pipeline, False)


def test_pieces_staged_equal_single(models: tuple[LoadedModel, LoadedModel]) -> None:
    single, staged = models
    vocab = single.config.vocab_size
    runs = []
    for model in (single, staged):
        _pieces(model.pipeline, True)
        runs.append(_run(model.pipeline, vocab))
        _pieces(model.pipeline, False)
    assert _same(*runs)


@pytest.mark.parametrize("kernels", [False, pytest.param(True, marks=needs_kernels)], ids=["torch", "triton"])
def test_padding_tokens_reach_no_real_token(models: tuple[LoadedModel, LoadedModel], kernels: bool,
                                            request: pytest.FixtureRequest) -> None:
    # garbage in every static buffer's padding rows (what earlier, longer steps leave) changes nothing real
    single, _ = models
    pipeline, vocab = single.pipeline, single.config.vocab_size
    with _kernels(request, kernels):
        _pieces(pipeline, True)
        clean = _run(pipeline, vocab)
        packed = pipeline.stages[0].packed
        assert packed is not None
        with torch.inference_mode():  # the buffers are made while a step runs
            for buffer in (packed.output, *packed._shared.values()):
                buffer.normal_(0, 1e3)
        dirty = _run(pipeline, vocab)
        _pieces(pipeline, False)
    assert _same(clean, dirty)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preset", PRESETS)
def test_captured_pieces_on_the_gpu(preset: str) -> None:
    """CUDA graphs captured and replayed (the load enables them): the same logits and state as the eager
    step, a bucket's replays bit for bit its first (eager) run's, and two stages the same bits as one."""
    runs = []
    layouts = [("cuda:0", "single")] + ([("cuda:0,cuda:1", "pipeline:2")] if torch.cuda.device_count() > 1 else [])
    for devices, placement in layouts:
        model = load_model(preset, devices, placement, 96, dtype="float32", max_seqs=4, prefill_chunk=KV_BLOCK_TOKENS)
        try:
            pipeline, vocab = model.pipeline, model.config.vocab_size
            packed = [stage.packed for stage in pipeline.stages]
            # the most a step carries: 3 rows decoding beside a block of a prompt (67), rounded up to 80; the
            # steps below take buckets 24 and 16 (with 16-token chunks a step carries 16 tokens: one bucket)
            assert model.profile.step_tokens == 3 + KV_BLOCK_TOKENS
            assert all(p is not None and p.buckets == token_buckets(3 + KV_BLOCK_TOKENS) for p in packed)
            assert all(p is not None and {16, 24} <= set(p.buckets) for p in packed)
            first = _run(pipeline, vocab)  # captures buckets 24 and 16 after their first steps
            replayed = _run(pipeline, vocab)  # every step a replay
            for stage in pipeline.stages:
                stage.packed = None
            eager = _run(pipeline, vocab)
            assert _same(first, replayed)
            for g, w in zip(replayed[0], eager[0], strict=True):
                torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
            runs.append(replayed)
        finally:
            model.close()
    assert _same(runs[0], runs[-1])
