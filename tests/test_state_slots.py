"""State slots: each row's recurrent state lives in entries the stage's table names; steps publish or roll
back by rewriting the table, rows move and restore without copying; through the batcher, sequences that
join, leave, are cancelled and preempted never read each other's state (a property test against each
request alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stagewise.engine.batcher import Batcher
from stagewise.engine.generation_request import GenerationRequest
from stagewise.engine.loaded_model import LoadedModel
from stagewise.engine.model_loading import load_model
from stagewise.engine.sampling import SamplingParams
from stagewise.errors import StepCancelled
from stagewise.models.state_slots import ZERO_ENTRY, StateSlots
from stagewise.spec.kv_pool import KV_BLOCK_TOKENS
from tests.batch_runs import run_batch

GREEDY = SamplingParams(temperature=0.0)
CPU = torch.device("cpu")


def test_a_step_writes_its_own_entries_and_publishing_makes_them_read() -> None:
    slots = StateSlots(3, CPU, snapshots=2)
    assert slots.entries == 1 + 2 * 3 + 2 and slots.first_snapshot == 7
    assert [slots.read_entry(r) for r in range(3)] == [ZERO_ENTRY] * 3  # fresh rows read zeros
    first = [slots.write_entry(r) for r in range(3)]
    slots.begin(range(3))
    slots.publish(range(3))
    assert [slots.read_entry(r) for r in range(3)] == first
    second = [slots.write_entry(r) for r in range(3)]
    assert not set(first) & set(second)  # the next step never writes what it reads
    slots.begin([0, 2])
    slots.rollback([0, 2])
    assert [slots.read_entry(r) for r in range(3)] == first  # rolled back: nothing changed
    slots.check()


def test_moves_swap_entries_and_restores_read_a_snapshot() -> None:
    slots = StateSlots(3, CPU, snapshots=2)
    slots.begin(range(3))
    slots.publish()
    read = [slots.read_entry(r) for r in range(3)]
    slots.move(2, 0)
    assert slots.read_entry(0) == read[2] and slots.read_entry(2) == read[0]
    slots.restore(1, 8)
    assert slots.read_entry(1) == 8 and slots.write_entry(1) in (3, 4)
    slots.begin([1])
    slots.publish([1])
    assert slots.read_entry(1) in (3, 4)  # its own again, holding what the step computed from the snapshot
    slots.check()
    with pytest.raises(ValueError, match="snapshot"):
        slots.restore(0, 2)  # another row's entry


def test_an_unsettled_step_blocks_another_over_its_rows() -> None:
    slots = StateSlots(4, CPU)
    slots.begin([0, 2])
    slots.begin([1, 3])
    with pytest.raises(RuntimeError, match="not settled"):
        slots.begin([2])
    slots.publish([1, 3])
    slots.publish([0, 2])
    slots.check()


@pytest.fixture(scope="module")
def hybrid() -> Iterator[LoadedModel]:
    pool = 6 * KV_BLOCK_TOKENS  # three rows of up to two blocks at once: preemption under load
    model = load_model("random:tiny-qwen3.6", "cpu:1x4GiB", "single", 256, max_seqs=3, prefill_chunk=64,
                       kv_tokens=pool)
    yield model
    model.close()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(1, 60), st.booleans()), min_size=3, max_size=7),
       st.integers(0, 2**16))
def test_churn_never_mixes_states(hybrid: LoadedModel, jobs: list[tuple[int, int, bool]], seed: int) -> None:
    """Requests of random lengths and budgets, some cancelled part-way, through three rows and a pool
    too small for all: every request that finishes gives its tokens alone, and after every iteration
    the stage's slots are a partition of its entries."""
    gen = torch.Generator().manual_seed(seed)
    vocab = hybrid.config.vocab_size
    requests = [GenerationRequest(tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()), budget, GREEDY)
                for n, budget, _ in jobs]
    cancel_at = {i: max(1, budget // 2) for i, (_, budget, cancel) in enumerate(jobs) if cancel}
    batcher = Batcher(hybrid.pipeline, hybrid.max_context, 64)
    slots = hybrid.pipeline.stages[0].states.slots  # type: ignore[union-attr]
    assert slots is not None
    alone = [run_batch(batcher, [r])[0][0] for r in requests]
    got, errors = run_batch(batcher, requests, cancelled=lambda i, n: i in cancel_at and n >= cancel_at[i],
                            each_iteration=slots.check)
    for i, (out, error) in enumerate(zip(got, errors, strict=True)):
        if i in cancel_at and error is not None:
            assert isinstance(error, StepCancelled)
            continue
        assert error is None
        assert [t for t, _ in out] == [t for t, _ in alone[i]], i
