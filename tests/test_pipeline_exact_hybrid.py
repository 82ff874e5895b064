"""MoE and hybrid families: staged runs are bit-identical to one device, conv/recurrent state included,
and a failed step rolls the recurrent state back exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stagewise.errors import StepFailed
from tests.hf_hybrid_models import make_hf_hybrid_model
from tests.staged import assert_traces_equal, load_pipeline, run_trace

CASES = {"qwen3_moe-sparse": [[1], [1, 2]], "qwen3_next-default-pattern": [[2], [1, 3], [1, 2, 3]],
         "qwen3_5-default-pattern": [[3], [1, 2]], "qwen3_5_moe-text": [[2], [1, 2, 3]]}
PROMPT = [(i * 29 + 3) % 150 for i in range(40)]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hybrid_staged_equals_single(tmp_path: Path, name: str, dtype: torch.dtype) -> None:
    make_hf_hybrid_model(name, tmp_path, seed=4)
    single = run_trace(load_pipeline(tmp_path, [], dtype), PROMPT, chunk=16, decode_steps=32)
    assert any(k.endswith(".recurrent") for k in single.states) or "moe" in name
    for cuts in CASES[name]:
        assert_traces_equal(single, run_trace(load_pipeline(tmp_path, cuts, dtype), PROMPT, chunk=16, decode_steps=32))


def test_recurrent_state_rolled_back_exactly(tmp_path: Path) -> None:
    make_hf_hybrid_model("qwen3_next-default-pattern", tmp_path, seed=2)
    clean = run_trace(load_pipeline(tmp_path, [2], torch.float32), PROMPT, chunk=16, decode_steps=8)
    pipeline = load_pipeline(tmp_path, [2], torch.float32)
    failed: set[int] = set()

    def hook(stage: int, step: int) -> None:
        if stage == 1 and step in (2, 6) and step not in failed:  # a prefill and a decode step, once each
            failed.add(step)
            raise RuntimeError("injected")

    pipeline.fault_hook = hook
    original = pipeline.step

    def retrying(*args: object, **kwargs: object) -> object:
        before = {k: {n: t.clone() for n, t in s.tensors().items()}
                  for st in pipeline.stages for k, s in st.states.items() if "recurrent" in s.tensors()}
        try:
            return original(*args, **kwargs)  # type: ignore[arg-type]
        except StepFailed:
            for st in pipeline.stages:
                for k, s in st.states.items():
                    for n, t in s.tensors().items():
                        if k in before:
                            assert torch.equal(t, before[k][n]), (k, n)
            pipeline.step_id -= 1
            return original(*args, **kwargs)  # type: ignore[arg-type]

    pipeline.step = retrying  # type: ignore[method-assign]
    assert_traces_equal(clean, run_trace(pipeline, PROMPT, chunk=16, decode_steps=8))
    assert failed == {2, 6}
