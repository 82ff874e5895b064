"""``devices --measure`` on virtual CPU devices: figures measured, cached per machine, reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.measure import SAME_MODEL_TOLERANCE, apply_cached, apply_figures, measure_topology


def test_measure_caches_and_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGEWISE_CACHE", str(tmp_path))
    topology = resolve_device_spec("cpu:2x1GiB")
    measured, figures = measure_topology(topology)
    assert all(d.measured for d in measured.devices)
    assert figures["devices"]["cpu:0"]["memory_bandwidth_bytes_per_s"] > 0
    cached = list(tmp_path.glob("measure-*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["devices"]
    again = apply_cached(topology)  # no timing: the cached figures
    assert [d.memory_bandwidth_bytes_per_s for d in again.devices] == [
        d.memory_bandwidth_bytes_per_s for d in measured.devices]


def test_identical_devices_share_figures_within_the_noise_tolerance() -> None:
    # run-to-run noise must not decide a placement: same-model figures within the tolerance are
    # averaged; figures further apart are real differences and are kept (synthetic, deterministic)
    topology = resolve_device_spec("cpu:3x1GiB")
    close = {"cpu:0": 40e9, "cpu:1": 40e9 * (1 + SAME_MODEL_TOLERANCE / 2), "cpu:2": 41e9}
    figures = {"devices": {i: {"memory_bandwidth_bytes_per_s": bw, "matmul_flops_per_s": 1e12}
                           for i, bw in close.items()}}
    shared = apply_figures(topology, figures)
    assert len({d.memory_bandwidth_bytes_per_s for d in shared.devices}) == 1
    far = {**close, "cpu:2": 40e9 * (1 + 3 * SAME_MODEL_TOLERANCE)}
    figures = {"devices": {i: {"memory_bandwidth_bytes_per_s": bw, "matmul_flops_per_s": 1e12}
                           for i, bw in far.items()}}
    kept = apply_figures(topology, figures)
    assert len({d.memory_bandwidth_bytes_per_s for d in kept.devices}) == 3
