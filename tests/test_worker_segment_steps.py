"""Micro-batches in flight inside one worker: several steps over disjoint rows provisional at once, each
published or rolled back by its step id without touching the others — on a hybrid model, whose
recurrent rows are double-buffered (``StateSlots``), against an in-process pipeline that settles
every step as it goes (bit-identical logits, features and state)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.errors import WorkerMessageRejected
from stagewise.models.state_slots import ZERO_ENTRY, StateSlots
from stagewise.runtime.builder import build_pipeline
from stagewise.runtime.pipeline import Pipeline
from stagewise.runtime.worker_messages import Run
from stagewise.runtime.worker_segment import WorkerSegment
from stagewise.spec.model_config import ModelConfig
from stagewise.weights.safetensors_source import SafetensorsSource
from tests.hf_hybrid_models import make_hf_hybrid_model
from tests.staged import specs_for_cuts

ROWS, CONTEXT = 4, 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hybrid-steps")
    make_hf_hybrid_model("qwen3_5-default-pattern", path, seed=3)  # linear attention: recurrent rows
    return path


def _pipeline(path: Path) -> Pipeline:
    config = ModelConfig.from_path(path)
    return build_pipeline(config, SafetensorsSource(path), specs_for_cuts(config, [1]), torch.float32, ROWS, CONTEXT)


def _cmd(step_id: int, tokens: list[list[int]], first_row: int, start: int) -> Run:
    positions = [list(range(start, start + len(tokens[0])))] * len(tokens)
    return Run(seq=step_id, members={}, step_id=step_id, tokens=tokens, positions=positions, start=start,
               all_logits=True, first_row=first_row)


def _step(pipeline: Pipeline, cmd: Run) -> torch.Tensor:
    out = pipeline.step(torch.tensor(cmd.tokens), torch.tensor(cmd.positions), start=cmd.start,
                        all_logits=cmd.all_logits, first_row=cmd.first_row)
    assert out.logits is not None
    return out.logits


def _states(pipeline: Pipeline) -> dict[str, torch.Tensor]:
    return {f"{k}.{i}.{name}": t for k, stage in enumerate(pipeline.stages) for i, state in stage.states.items()
            for name, t in state.tensors().items()}


def test_steps_in_flight_settle_apart(model_dir: Path) -> None:
    reference, worker = _pipeline(model_dir), _pipeline(model_dir)
    segment = WorkerSegment(worker.stages, None, None, reference.hidden_size, context=CONTEXT, batch=ROWS)
    for pipe in (reference, worker):
        for row in range(ROWS):
            pipe.reset(row)
    a = _cmd(1, [[5, 9, 2, 7, 1], [3, 3, 8, 0, 4]], first_row=0, start=0)
    b = _cmd(2, [[6, 1, 1, 9, 2], [7, 2, 5, 5, 8]], first_row=2, start=0)
    want_a, want_b = _step(reference, a), _step(reference, b)

    got_a = segment.run(a).output
    got_b = segment.run(b).output  # both provisional: rows 0-1 and rows 2-3
    assert got_a is not None and got_b is not None
    assert torch.equal(got_a.logits, want_a) and torch.equal(got_b.logits, want_b)
    with pytest.raises(WorkerMessageRejected, match="overlap step 1"):
        segment.run(_cmd(3, [[1], [1]], first_row=1, start=5))  # rows 1-2: both unsettled
    segment.rollback(2)  # b never happened ...
    segment.publish(1)  # ... and a is accepted, alone
    assert segment.pending == {}
    again = segment.run(_cmd(4, b.tokens, first_row=2, start=0)).output  # b again, from the published rows
    assert again is not None and torch.equal(again.logits, want_b)
    segment.publish(4)

    # decode, two micro-batches in flight, settled out of order
    c, d = _cmd(5, [[11], [12]], first_row=0, start=5), _cmd(6, [[13], [14]], first_row=2, start=5)
    want_c, want_d = _step(reference, c), _step(reference, d)
    got_c, got_d = segment.run(c).output, segment.run(d).output
    segment.publish(6)
    segment.publish(5)
    assert got_c is not None and got_d is not None
    assert torch.equal(got_c.logits, want_c) and torch.equal(got_d.logits, want_d)
    e = _cmd(7, [[15], [16]], first_row=0, start=6)  # reads rows 0-1 as published by c
    got_e = segment.run(e).output
    segment.publish(7)
    assert got_e is not None and torch.equal(got_e.logits, _step(reference, e))
    want, got = _states(reference), _states(worker)
    assert want.keys() == got.keys() and any("recurrent" in k or "conv" in k for k in want)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_recurrent_rows_of_an_unsettled_step_are_not_written_again() -> None:
    slots = StateSlots(4, torch.device("cpu"))
    for row in range(4):
        slots.reset(row)
    slots.begin(range(0, 2))
    slots.begin(range(2, 4))
    with pytest.raises(RuntimeError, match="not settled"):
        slots.begin(range(1, 3))
    fresh = [slots.write_entry(r) for r in range(4)]
    slots.rollback(range(2, 4))
    slots.publish(range(0, 2))
    assert [slots.read_entry(r) for r in range(2)] == fresh[:2]  # published: what the step wrote
    assert [slots.read_entry(r) for r in range(2, 4)] == [ZERO_ENTRY] * 2  # rolled back: never published


def test_local_workers_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each local worker gets its share of this process's cores (``OMP_NUM_THREADS``), at least one."""
    from stagewise.runtime import worker_pool

    monkeypatch.setattr(worker_pool.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    assert worker_pool.local_worker_threads(2) == 8
    assert worker_pool.local_worker_threads(3) == 5
    assert worker_pool.local_worker_threads(32) == 1
