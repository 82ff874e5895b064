"""The seed case, user overrides, does-not-fit details and the certificate."""

from __future__ import annotations

import dataclasses
import json

import pytest

from stagewise.errors import DoesNotFit, PlacementError
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.placement import Shard, plan, verify
from stagewise.spec.model_config import ModelConfig
from stagewise.spec.model_spec import ModelSpec
from stagewise.spec.profile import Profile

REF = "/work/shared/reference"
SEED_TOPO = f"{REF}/topologies/seed-2x3090-pcie.json"


@pytest.fixture(scope="module")
def qwen36() -> ModelSpec:
    return ModelSpec.from_config(ModelConfig.from_path(f"{REF}/models/qwen3.6-35b-a3b.json"), "q8_0", name="qwen3.6")


def test_seed_does_not_fit_one_3090_fits_across_two(qwen36: ModelSpec) -> None:
    topo = resolve_device_spec(SEED_TOPO)
    for device_id in topo.ids:
        single = plan(qwen36, topo.subset([device_id]))
        assert single.outcome == "does_not_fit" and single.deficit_bytes > 0
    cert = plan(qwen36, topo)
    verify(cert, qwen36, topo, Profile())
    assert cert.outcome == "fits_across" and len(cert.stages) == 2
    first = cert.stages[0].placement
    assert first.entry and not first.exit and cert.stages[1].placement.exit
    assert abs(first.end - 21) <= 1  # RFC: blocks 0..20 | 21..39
    payload = json.loads(cert.to_json())
    assert payload["stages"][0]["blocks"] == [0, first.end]
    assert payload["fingerprint"].startswith("sha256:")


def test_split_and_order_are_honoured_or_refused(qwen36: ModelSpec) -> None:
    topo = resolve_device_spec(SEED_TOPO)
    cert = plan(qwen36, topo, split=[21, 19], order=["cuda:1", "cuda:0"])
    assert [(s.placement.device_id, s.placement.start, s.placement.end) for s in cert.stages] == [
        ("cuda:1", 0, 21),
        ("cuda:0", 21, 40),
    ]
    with pytest.raises(PlacementError, match="--split"):
        plan(qwen36, topo, split=[20, 19])
    with pytest.raises(PlacementError, match="no legal split"):
        plan(qwen36, topo, split=[39, 1])
    with pytest.raises(PlacementError, match="unknown device id"):
        plan(qwen36, topo, order=["cuda:7", "cuda:0"])
    with pytest.raises(PlacementError, match="twice"):
        plan(qwen36, topo, order=["cuda:0", "cuda:0"])
    with pytest.raises(PlacementError, match="only 2 available"):
        plan(qwen36, topo, stages=3)
    with pytest.raises(PlacementError, match="no legal 1-stage"):
        plan(qwen36, topo, stages=1)
    with pytest.raises(PlacementError, match="disagree"):
        plan(qwen36, topo, split=[21, 19], stages=1)
    with pytest.raises(PlacementError, match="max-stages"):
        plan(qwen36, topo, stages=2, max_stages=1)


def test_exact_stage_count(qwen36: ModelSpec) -> None:
    topo = resolve_device_spec("4x24GiB")
    assert len(plan(qwen36, topo, stages=3).stages) == 3
    assert len(plan(qwen36, topo).stages) == 2


def test_does_not_fit_reports_limit_and_longest_context(qwen36: ModelSpec) -> None:
    topo = resolve_device_spec("2x20GB")
    cert = plan(qwen36, topo, Profile(context_tokens=262144))
    assert cert.outcome == "does_not_fit"
    assert cert.limiting_device in topo.ids and cert.deficit_bytes > 0
    assert cert.required_bytes == cert.budget_bytes + cert.deficit_bytes
    assert cert.longest_context_tokens is not None and 4096 < cert.longest_context_tokens < 262144
    assert plan(qwen36, topo, Profile(context_tokens=cert.longest_context_tokens)).fits
    with pytest.raises(DoesNotFit):
        cert.require_fit()
    max1 = plan(qwen36, resolve_device_spec("2x24GiB"), max_stages=1)
    assert max1.outcome == "does_not_fit" and any("would fit" in r for r in max1.reasons)


def test_verify_rejects_tampering(qwen36: ModelSpec) -> None:
    topo = resolve_device_spec(SEED_TOPO)
    cert = plan(qwen36, topo)
    with pytest.raises(PlacementError):
        verify(cert, qwen36, topo, Profile(context_tokens=8192))
    bad_stage = dataclasses.replace(cert.stages[0], charge=dataclasses.replace(cert.stages[0].charge, state_bytes=0))
    tampered = dataclasses.replace(cert, stages=(bad_stage, cert.stages[1]))
    with pytest.raises(PlacementError, match="charge"):
        verify(tampered, qwen36, topo, Profile())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cert.outcome = "fits_single"  # type: ignore[misc]


def test_shard_is_validated() -> None:
    assert not Shard().is_sharded
    assert Shard(tensor_degree=2).is_sharded
    with pytest.raises(PlacementError):
        Shard(tensor_degree=3)
    with pytest.raises(PlacementError):
        Shard(tensor_degree=4).check_divides(num_heads=16, num_kv_heads=2, num_experts=0)


def test_heterogeneous_asymmetric_split() -> None:
    spec = ModelSpec.from_config(ModelConfig.from_path(f"{REF}/models/qwen3-30b-a3b.json"), "q8_0")
    topo = resolve_device_spec(f"{REF}/topologies/24+12-3090-3060.json")
    cert = plan(spec, topo)
    verify(cert, spec, topo, Profile())
    assert cert.outcome == "fits_across"
    sizes = {s.placement.device_id: s.placement.num_blocks for s in cert.stages}
    assert sizes["cuda:0"] > sizes["cuda:1"]
