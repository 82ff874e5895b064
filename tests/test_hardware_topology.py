"""Device specs, topology files, link defaults, reserve policy and discovery on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.errors import TopologyError
from stagewise.hardware.device_spec import parse_device_spec, resolve_device_spec
from stagewise.hardware.discovery import discover_topology
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.hardware.sizes import parse_bytes

TOPOS = Path("/work/shared/reference/topologies")


def test_sizes() -> None:
    assert parse_bytes("24GiB") == 24 << 30
    assert parse_bytes("22.76GB") == 22_760_000_000
    assert parse_bytes("512") == 512
    for bad in ("-1GiB", "5PB", "2 parsecs", "", "1e30"):
        with pytest.raises(TopologyError):
            parse_bytes(bad, "x")


def test_compact_specs() -> None:
    sims = resolve_device_spec("4x24GiB,12GiB")
    assert sims.ids == ("sim:0", "sim:1", "sim:2", "sim:3", "sim:4")
    assert sims.device("sim:4").budget_bytes == 12 << 30 and not sims.device("sim:4").executable
    cpus = resolve_device_spec("cpu:2x4GiB")
    assert [d.torch_device for d in cpus.devices] == ["cpu", "cpu"]
    assert cpus.link("cpu:0", "cpu:1").kind == "same-device"
    real = parse_device_spec("cuda:0@22.76GB,cuda:1@22.76GB")
    assert [(d.id, d.budget_bytes, d.torch_device) for d in real] == [
        ("cuda:0", 22_760_000_000, "cuda:0"),
        ("cuda:1", 22_760_000_000, "cuda:1"),
    ]


def test_bad_specs_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="unknown device id 'cuda:0'"):
        resolve_device_spec("cuda:0@20GB", discover=lambda: discover_topology())
    with pytest.raises(TopologyError, match="entry 1"):
        resolve_device_spec("4GiB,-2GiB")
    with pytest.raises(TopologyError, match="cannot read"):
        resolve_device_spec(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"devices": [{"id": "cuda:0", "memory_bytes": -5}]}))
    with pytest.raises(TopologyError, match="memory_bytes"):
        resolve_device_spec(str(bad))
    bad.write_text(json.dumps({"devices": [{"id": "cuda:0", "memory_bytes": 10}], "links": [{"between": ["cuda:0", "cuda:9"], "kind": "nvlink", "bandwidth": 1e9}]}))
    with pytest.raises(TopologyError, match="cuda:9"):
        resolve_device_spec(str(bad))
    bad.write_text(json.dumps({"devices": [{"id": "gpu0", "memory_bytes": 10}]}))
    with pytest.raises(TopologyError, match="'id'"):
        resolve_device_spec(str(bad))


@pytest.mark.parametrize("path", sorted(TOPOS.glob("*.json")))
def test_reference_topologies_load(path: Path) -> None:
    topo = resolve_device_spec(str(path))
    raw = json.loads(path.read_text())
    assert len(topo.devices) == len(raw["devices"])
    for d in topo.devices:
        assert 0 < d.budget_bytes <= d.memory_bytes
    if "seed" in path.name:
        assert [d.budget_bytes for d in topo.devices] == [22_760_000_000, 22_766_000_000]


def test_link_defaults(tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"devices": [
        {"id": "cuda:0", "host": "a", "memory_bytes": 10**10},
        {"id": "cuda:1", "host": "a", "memory_bytes": 10**10},
        {"id": "cuda:2", "host": "b", "memory_bytes": 10**10},
    ]}))
    topo = resolve_device_spec(str(f))
    assert topo.link("cuda:0", "cuda:1").kind == "pcie-host-staged"
    assert topo.link("cuda:1", "cuda:2").kind == "network"


def test_reserve_policy() -> None:
    default = ReservePolicy()
    assert default.budget_bytes("cuda", 24 << 30) == (24 << 30) - int(0.06 * (24 << 30))
    assert default.budget_bytes("cuda", 8 << 30, free_bytes=4 << 30) == (4 << 30) - (1 << 30)
    assert ReservePolicy.parse("2GiB").reserve_bytes("cuda", 24 << 30) == 2 << 30
    assert ReservePolicy.parse("cpu=10%").reserve_bytes("cpu", 100) == 10
    with pytest.raises(TopologyError):
        ReservePolicy.parse("150%")


def test_discovery_on_cpu_returns_cpu() -> None:
    topo = discover_topology()
    cpu = topo.device("cpu:0")
    assert cpu.torch_device == "cpu" and 0 < cpu.budget_bytes < cpu.memory_bytes
