"""Hypothesis properties: legal stages only, fewest devices, listing order irrelevant."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_cases import PROFILE, random_spec, random_topology

from stagewise.hardware.topology import Topology
from stagewise.placement import plan, verify
from stagewise.placement.search import Searcher

cases = st.tuples(st.integers(0, 10**6), st.integers(1, 5), st.integers(1, 24), st.sampled_from(["latency", "throughput"]))


def _build(seed: int, n_dev: int, n_blocks: int):
    rng = random.Random(seed)
    spec = random_spec(rng, n_blocks, tied=seed % 2 == 0)
    return spec, random_topology(rng, n_dev, spec)


@settings(max_examples=60, deadline=None)
@given(cases)
def test_every_stage_is_legal_and_verifies(case) -> None:
    seed, n_dev, n_blocks, objective = case
    spec, topo = _build(seed, n_dev, n_blocks)
    cert = plan(spec, topo, PROFILE, objective=objective)
    verify(cert, spec, topo, PROFILE)
    for s in cert.stages:
        assert s.charge.total_bytes <= topo.device(s.placement.device_id).budget_bytes


@settings(max_examples=60, deadline=None)
@given(cases)
def test_fewest_devices(case) -> None:
    seed, n_dev, n_blocks, objective = case
    spec, topo = _build(seed, n_dev, n_blocks)
    cert = plan(spec, topo, PROFILE, objective=objective)
    searcher = Searcher(spec, topo, PROFILE, list(topo.devices))
    legal = [k for k in range(1, min(n_dev, n_blocks) + 1) if searcher.feasible(k)]
    if not legal:
        assert cert.outcome == "does_not_fit"
    else:
        assert len(cert.stages) == min(legal)


@settings(max_examples=40, deadline=None)
@given(cases, st.randoms(use_true_random=False))
def test_independent_of_listed_device_order(case, shuffler) -> None:
    seed, n_dev, n_blocks, objective = case
    spec, topo = _build(seed, n_dev, n_blocks)
    devices, links = list(topo.devices), list(topo.links)
    shuffler.shuffle(devices)
    shuffler.shuffle(links)
    shuffled = Topology(tuple(devices), tuple(links))
    a = plan(spec, topo, PROFILE, objective=objective)
    b = plan(spec, shuffled, PROFILE, objective=objective)
    assert a.to_json() == b.to_json()
