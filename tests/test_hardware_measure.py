"""``devices --measure`` on virtual CPU devices: figures measured, cached per machine, reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.measure import apply_cached, measure_topology


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
    # identical devices share one figure: run-to-run noise must not decide a placement
    assert len({d.memory_bandwidth_bytes_per_s for d in again.devices}) == 1
