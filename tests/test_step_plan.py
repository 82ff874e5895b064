"""The packed step's plan on host integers: decoding rows first, prompt chunks first come, first served
within what they leave of the budget, logits for decoding rows and prompts ending unless recomputed;
the plan, the staging area and the decode groups import without torch."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stagewise
from stagewise.engine.staging_area import StagingArea
from stagewise.engine.step_plan import plan_decode_step, plan_packed_step


@dataclass
class _Decoding:
    row: int
    length: int
    next_token: int
    device_greedy: bool = True


@dataclass
class _Staged:
    row: int
    ids: tuple[int, ...]
    prefilled: int = 0
    tokens: list[int] = field(default_factory=list)
    device_greedy: bool = True


def _area(*members: _Staged) -> StagingArea[_Staged]:
    return StagingArea(16, first=members[0].row if members else 0, members=list(members))


def test_decoding_rows_then_chunks_within_the_budget() -> None:
    decoding = [_Decoding(0, 7, 101), _Decoding(1, 3, 102)]
    area = _area(_Staged(2, tuple(range(10, 20)), prefilled=5), _Staged(3, tuple(range(30, 50))))
    plan = plan_packed_step(decoding, area, 16)
    assert plan is not None and plan.decoding == 2
    assert plan.members == (0, 1) and plan.chunks == (5, 9)  # 14 of the 16: the second runs 9 of its 20
    assert plan.layout.rows == (0, 1, 2, 3) and plan.layout.starts == (7, 3, 5, 0)
    assert plan.token_ids == (101, 102, *range(15, 20), *range(30, 39))
    assert plan.sampled == (0,) and plan.layout.logits == (0, 1, 2)  # the first prompt ends: its first token
    assert plan.greedy
    area.members[0].device_greedy = False  # the prompt that samples draws on the host: so does the step
    assert not plan_packed_step(decoding, area, 16).greedy  # type: ignore[union-attr]
    area.members[0].device_greedy, area.members[1].device_greedy = True, False  # one that samples nothing
    assert plan_packed_step(decoding, area, 16).greedy  # type: ignore[union-attr]


def test_a_decode_step_runs_its_group_with_padding() -> None:
    plan = plan_decode_step(1, 4, [_Decoding(4, 9, 7), None, _Decoding(6, 3, 8, device_greedy=False), None])
    assert plan is not None and plan.group == 1 and plan.first_row == 4 and plan.rows == 4
    assert plan.live == (True, False, True, False)
    assert plan.token_ids == (7, 0, 8, 0) and plan.positions == (9, 0, 3, 0)  # padding: token 0 at 0
    assert not plan.greedy
    assert plan_decode_step(0, 0, [_Decoding(0, 1, 2)]).greedy  # type: ignore[union-attr]
    assert plan_decode_step(0, 0, [None, None]) is None


def test_a_recomputed_prompt_samples_nothing() -> None:
    area = _area(_Staged(0, (1, 2, 3), tokens=[9]), _Staged(1, (4, 5)))
    plan = plan_packed_step([], area, 16)
    assert plan is not None and plan.sampled == (1,) and plan.layout.logits == (1,)


def test_prompts_never_starve_and_nothing_runs_without_tokens() -> None:
    decoding = [_Decoding(r, 4, 1) for r in range(20)]  # more decoding rows than the budget
    plan = plan_packed_step(decoding, _area(_Staged(20, (1, 2, 3))), 16)
    assert plan is not None and plan.chunks == (1,)
    assert plan_packed_step([], _area(), 16) is None
    aligned = StagingArea(128, first=70, members=[_Staged(70, tuple(range(300)))], align_tokens=64)
    crowded = [_Decoding(r, 4, 1) for r in range(70)]  # 70 of the 128 tokens: 58 left, less than a block
    plan = plan_packed_step(crowded, aligned, 128)
    assert plan is not None and plan.chunks == (64,)  # still a whole block


@pytest.mark.parametrize("module", ["stagewise.engine.step_plan", "stagewise.engine.staging_area",
                                    "stagewise.engine.decode_groups", "stagewise.models.step_layout",
                                    "stagewise.engine.step_scheduler", "stagewise.engine.row_compaction",
                                    "stagewise.engine.sequence_blocks"])
def test_imports_without_torch(module: str) -> None:
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3]))")
    root = Path(stagewise.__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_no_packed_step_carries_more_than_the_profile_charges(data: st.DataObject) -> None:
    # Profile.step_tokens sizes a step's workspace and the packed steps' graph buckets: no plan exceeds it
    from stagewise.spec.kv_pool import KV_BLOCK_TOKENS
    from stagewise.spec.profile import Profile

    batch = data.draw(st.integers(1, 40))
    chunk = data.draw(st.integers(1, 600))
    context = data.draw(st.integers(2, 700))
    decoding = data.draw(st.integers(0, batch - 1))
    prompts = data.draw(st.lists(st.integers(1, context), min_size=1, max_size=batch - decoding))
    prefilled = [data.draw(st.integers(0, n - 1)) for n in prompts]
    area = StagingArea(chunk, first=decoding, align_tokens=KV_BLOCK_TOKENS if chunk >= KV_BLOCK_TOKENS else 1,
                       members=[_Staged(decoding + i, tuple(range(n)), prefilled=p)
                                for i, (n, p) in enumerate(zip(prompts, prefilled, strict=True))])
    plan = plan_packed_step([_Decoding(r, 1, 5) for r in range(decoding)], area, chunk)
    assert plan is not None
    assert plan.layout.tokens <= Profile(context_tokens=context, batch=batch, prefill_chunk_tokens=chunk).step_tokens
