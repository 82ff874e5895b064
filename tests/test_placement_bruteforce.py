"""The planner equals a brute-force optimum (fewest devices, then best key) on random cases."""

from __future__ import annotations

import random

import pytest
from test_placement_cases import PROFILE, brute_force, planned_key, random_spec, random_topology

from stagewise.placement import plan, verify


def _check(seed: int, n_dev: int, n_blocks: int, objective: str, tied: bool = False) -> None:
    rng = random.Random(seed)
    spec = random_spec(rng, n_blocks, tied)
    topo = random_topology(rng, n_dev, spec)
    expected = brute_force(spec, topo, PROFILE, objective)
    cert = plan(spec, topo, PROFILE, objective=objective)
    verify(cert, spec, topo, PROFILE)
    if expected is None:
        assert cert.outcome == "does_not_fit"
        return
    assert cert.fits, cert.reasons
    assert planned_key(cert, spec, topo, PROFILE, objective) == expected


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("seed", range(60))
def test_small_cases_match_brute_force(seed: int, objective: str) -> None:
    rng = random.Random(1000 + seed)
    _check(seed, n_dev=rng.randint(1, 4), n_blocks=rng.randint(1, 10), objective=objective, tied=seed % 3 == 0)


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("seed", range(6))
def test_six_devices_match_brute_force(seed: int, objective: str) -> None:
    _check(500 + seed, n_dev=6, n_blocks=7, objective=objective)


@pytest.mark.parametrize("objective", ["latency", "throughput"])
@pytest.mark.parametrize("seed", range(3))
def test_sixty_four_blocks_match_brute_force(seed: int, objective: str) -> None:
    """64 blocks: brute force over all cuts of up to 3 stages of 3 devices."""
    rng = random.Random(900 + seed)
    spec = random_spec(rng, 64)
    topo = random_topology(rng, 3, spec)
    expected = brute_force(spec, topo, PROFILE, objective)
    cert = plan(spec, topo, PROFILE, objective=objective)
    verify(cert, spec, topo, PROFILE)
    if expected is None:
        assert not cert.fits
    else:
        assert planned_key(cert, spec, topo, PROFILE, objective) == expected
