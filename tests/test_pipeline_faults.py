"""Injected failures and cancellations roll a step back; retries equal a run that never failed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.errors import StepCancelled, StepFailed
from stagewise.runtime.pipeline import Pipeline
from tests.hf_models import QWEN3_CONFIGS, make_hf_model
from tests.staged import Trace, assert_traces_equal, load_pipeline, run_trace

PROMPT = [(i * 13 + 5) % 150 for i in range(24)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3")
    make_hf_model("qwen3", QWEN3_CONFIGS["qwen3-gqa"] | {"num_hidden_layers": 4}, path, seed=9)
    return path


def _snapshot(pipeline: Pipeline, upto: int) -> dict[str, torch.Tensor]:
    snap = {}
    for stage in pipeline.stages:
        for block, state in stage.states.items():
            for name, t in state.tensors().items():
                snap[f"{block}.{name}"] = (t[:, :, :upto] if name in ("key", "value") else t).clone()
    return snap


def _faulty_trace(pipeline: Pipeline, fail_stage: int, fail_step: int, kind: str) -> Trace:
    """Like run_trace, but step ``fail_step`` fails once in ``fail_stage`` and is retried."""
    failures = {"left": 1}

    def hook(stage: int, step_id: int) -> None:
        if kind == "fault" and stage == fail_stage and step_id == fail_step and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected fault")

    pipeline.fault_hook = hook
    original_step = pipeline.step

    def step(tokens: torch.Tensor, positions: torch.Tensor, start: int | None = None,
             all_logits: bool = False, cancel: object = None) -> object:
        upto = int(positions.min())
        before = _snapshot(pipeline, upto)
        if kind == "cancel" and pipeline.step_id + 1 == fail_step and failures["left"]:
            failures["left"] -= 1
            checks = iter([False, True])  # pass the check before stage 0, cancel between stages 0 and 1
            with pytest.raises(StepCancelled, match="between stage 0 and stage 1"):
                original_step(tokens, positions, start, all_logits, cancel=lambda: next(checks))
            _assert_same(before, _snapshot(pipeline, upto))
            pipeline.step_id -= 1  # the retry reuses the step number, as the hook expects
        try:
            return original_step(tokens, positions, start, all_logits)
        except StepFailed:
            _assert_same(before, _snapshot(pipeline, upto))
            pipeline.step_id -= 1
            return original_step(tokens, positions, start, all_logits)

    pipeline.step = step  # type: ignore[method-assign]
    return run_trace(pipeline, PROMPT, chunk=8, decode_steps=12)


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("kind", ["fault", "cancel"])
@pytest.mark.parametrize(("fail_stage", "fail_step"), [(0, 2), (1, 3), (2, 6), (1, 9)])  # prefill: steps 1-3
def test_failed_step_rolls_back(model_dir: Path, kind: str, fail_stage: int, fail_step: int) -> None:
    clean = run_trace(load_pipeline(model_dir, [1, 3], torch.float32), PROMPT, chunk=8, decode_steps=12)
    faulty = _faulty_trace(load_pipeline(model_dir, [1, 3], torch.float32), fail_stage, fail_step, kind)
    assert_traces_equal(clean, faulty)


def test_cancel_before_the_first_stage_changes_nothing(model_dir: Path) -> None:
    pipeline = load_pipeline(model_dir, [2], torch.float32)
    clean = run_trace(load_pipeline(model_dir, [2], torch.float32), PROMPT, chunk=8, decode_steps=4)
    pipeline.reset(0)
    with pytest.raises(StepCancelled, match="before it started"):
        pipeline.step(torch.tensor([PROMPT[:8]]), torch.arange(8)[None], start=0, cancel=lambda: True)
    assert_traces_equal(clean, run_trace(pipeline, PROMPT, chunk=8, decode_steps=4))


def test_pipeline_usable_after_failure(model_dir: Path) -> None:
    pipeline = load_pipeline(model_dir, [2], torch.float32)
    pipeline.fault_hook = lambda stage, step: (_ for _ in ()).throw(RuntimeError("boom")) if stage == 1 else None
    with pytest.raises(StepFailed, match="rolled back"):
        run_trace(pipeline, PROMPT, chunk=8, decode_steps=2)
    pipeline.fault_hook = None
    fresh = run_trace(load_pipeline(model_dir, [2], torch.float32), PROMPT, chunk=8, decode_steps=6)
    assert_traces_equal(fresh, run_trace(pipeline, PROMPT, chunk=8, decode_steps=6))
