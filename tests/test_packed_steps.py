"""Packed steps (StepLayout): a decoding row and several prompts' chunks in one token column give what
the same tokens give in separate steps (within the batch tolerance transformers itself shows), staged =
single bit for bit (logits and every block's state), for attention-only and hybrid (recurrent-state) models."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.models.step_layout import StepLayout
from stagewise.runtime.pipeline import Pipeline
from tests.test_batching import BATCH_TOLERANCE

PRESETS = ["random:tiny-llama", "random:tiny-qwen3", "random:tiny-qwen3-moe", "random:tiny-qwen3.6"]


@pytest.fixture(scope="module", params=PRESETS)
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    single = load_model(request.param, "cpu:1x4GiB", "single", 96, max_seqs=4, prefill_chunk=16)
    staged = load_model(request.param, "cpu:2x2GiB", "pipeline:2", 96, max_seqs=4, prefill_chunk=16)
    yield single, staged
    single.close()
    staged.close()


def _ids(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# row 0 decodes its 11th token; row 1 runs tokens 4..9 of its prompt; row 2 its first 5 (from nothing)
LAYOUT = StepLayout(rows=(0, 1, 2), starts=(10, 4, 0), lengths=(1, 6, 5), logits=(0, 1, 2), decoding=1)


def prepare_packed(pipeline: Pipeline, vocab: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Rows 0 and 1 hold 10 and 4 positions, row 2 none; returns the packed step's tokens and positions
    ``(N, 1)`` and every segment's tokens."""
    for row in range(pipeline.rows):
        pipeline.reset(row)
    first, second, third = _ids(vocab, 11, 1), _ids(vocab, 10, 2), _ids(vocab, 5, 3)
    pipeline.step(first[None, :10], torch.arange(10)[None], start=0, first_row=0)
    pipeline.step(second[None, :4], torch.arange(4)[None], start=0, first_row=1)
    segments = [first[10:], second[4:], third]
    tokens = torch.cat(segments)[:, None]  # (N, 1)
    positions = torch.tensor(LAYOUT.positions())[:, None]  # (N, 1)
    return tokens, positions, segments


def _states(pipeline: Pipeline) -> dict[tuple[int, str], torch.Tensor]:
    return {(index, name): tensor for stage in pipeline.stages for index, state in stage.states.items()
            for name, tensor in state.tensors().items()}


def test_a_packed_step_gives_what_separate_steps_give(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    pipeline, vocab = single.pipeline, single.config.vocab_size
    tokens, positions, segments = prepare_packed(pipeline, vocab)
    packed = pipeline.step(tokens, positions, layout=LAYOUT).logits
    assert packed is not None and packed.shape == (3, 1, vocab)
    packed_states = {k: v.clone() for k, v in _states(pipeline).items()}
    prepare_packed(pipeline, vocab)
    want = [pipeline.step(seg[None], torch.arange(start, start + len(seg))[None], start=start, first_row=row).logits
            for seg, row, start in zip(segments, LAYOUT.rows, LAYOUT.starts, strict=True)]
    for i, logits in enumerate(want):
        assert logits is not None
        got, ref = torch.log_softmax(packed[i, 0], -1), torch.log_softmax(logits[0, -1], -1)
        assert float((got - ref).abs().max()) <= BATCH_TOLERANCE
    for key, tensor in _states(pipeline).items():  # the keys and values of every row's positions
        assert torch.allclose(tensor, packed_states[key], atol=1e-5), key


def test_packed_step_staged_equals_single(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, staged = pair
    vocab = single.config.vocab_size
    outs, states = [], []
    for model in (single, staged):
        tokens, positions, _ = prepare_packed(model.pipeline, vocab)
        outs.append(model.pipeline.step(tokens, positions, layout=LAYOUT).logits)
        states.append(_states(model.pipeline))
    assert torch.equal(outs[0], outs[1])
    assert states[0].keys() == states[1].keys()
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key


def test_only_named_segments_get_logits(pair: tuple[LoadedModel, LoadedModel]) -> None:
    single, _ = pair
    tokens, positions, _ = prepare_packed(single.pipeline, single.config.vocab_size)
    layout = StepLayout(LAYOUT.rows, LAYOUT.starts, LAYOUT.lengths, logits=(2,), decoding=1)
    out = single.pipeline.step(tokens, positions, layout=layout)
    assert out.logits is not None and out.logits.shape == (1, 1, single.config.vocab_size)
    tokens, positions, _ = prepare_packed(single.pipeline, single.config.vocab_size)
    silent = StepLayout(LAYOUT.rows, LAYOUT.starts, LAYOUT.lengths, decoding=1)
    assert single.pipeline.step(tokens, positions, layout=silent).logits is None


@pytest.mark.parametrize("fields", [
    dict(rows=(), starts=(), lengths=()),
    dict(rows=(0, 1), starts=(0,), lengths=(1, 1)),
    dict(rows=(0,), starts=(0,), lengths=(0,)),
    dict(rows=(0, 0), starts=(0, 3), lengths=(2, 2)),
    dict(rows=(0,), starts=(0,), lengths=(2,), logits=(1,)),
    dict(rows=(0, 1), starts=(0, 0), lengths=(2, 1), decoding=1),
])
def test_layout_rejects_what_no_step_is(fields: dict[str, tuple[int, ...]]) -> None:
    with pytest.raises(ValueError):
        StepLayout(**fields)  # type: ignore[arg-type]


def test_layout_arithmetic() -> None:
    assert LAYOUT.tokens == 12 and LAYOUT.offsets == (0, 1, 7, 12)
    assert LAYOUT.token_rows() == [0] + [1] * 6 + [2] * 5
    assert LAYOUT.positions() == [10, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert LAYOUT.logit_tokens() == [0, 6, 11]
    assert LAYOUT.kv_end == max(LAYOUT.positions()) + 1 == 11


def test_a_packed_step_reads_nothing_back_from_the_device(pair: tuple[LoadedModel, LoadedModel],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the step's extent is the layout's (host) arithmetic: a packed step never waits for the device
    # before its layers (on a GPU, the host queues the next step while this one runs)
    single, _ = pair
    stage = single.pipeline.stages[0]
    positions = torch.tensor(LAYOUT.positions())[:, None]

    def no_item(self: torch.Tensor) -> float:
        raise AssertionError("a packed step's context read a tensor back to the host")

    monkeypatch.setattr(torch.Tensor, "item", no_item)
    assert stage.states is not None
    ctx = stage.model.context(positions, None, torch.float32, layout=LAYOUT, slots=stage.states.slots)
    assert ctx.kv_length == LAYOUT.kv_end
