"""Links between workers are measured when they join and the planner uses the figures.

Unit level: probe messages round-trip through the control plane's codec; measured figures land on every link between two
workers' devices; the planner prices (and avoids) a slow measured hop. End to end (Gloo on
127.0.0.1): ``stagewise devices --workers N@HOST:PORT --measure`` shows the timed links beside the
defaults. (``load_model`` with two joining hosts is checked in test_multiprocess.py.)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stagewise.cli import main as cli
from stagewise.hardware import defaults
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.placement import plan
from stagewise.placement.cost_model import PS_PER_S, handoff_ps
from stagewise.runtime.cluster_links import probe_pairs, representative
from stagewise.runtime.distributed_topology import ClusterTopology, merge_reports, with_measured_links
from stagewise.runtime.link_probe import LinkFigures, LinkProbe, ProbePair, ProbeReport
from stagewise.runtime.message_seal import MessageSeal
from stagewise.runtime.worker_messages import Down, JoinReport, ProbeDone, ProbeRequest, Up
from stagewise.runtime.worker_secret import SECRET_ENV
from stagewise.spec.model_source import load_model_spec
from stagewise.spec.profile import Profile

MODEL = "/work/shared/reference/models/llama-3.1-8b.json"  # 16 GB at bf16: needs two 10 GiB devices


def _cluster(specs: list[str]) -> ClusterTopology:
    reports = {rank: JoinReport(rank=rank, incarnation=f"{rank:032x}", pid=100 + rank, host=f"host{rank}",
                                topology=resolve_device_spec(spec).to_dict())
               for rank, spec in enumerate(specs, start=1)}
    return merge_reports(reports)


def _figures(a: int, b: int, latency_s: float, bandwidth_bytes_per_s: float) -> LinkFigures:
    large = 4 << 20
    return LinkFigures(a, b, 8192, latency_s, large, large / bandwidth_bytes_per_s)


def test_probe_messages_round_trip() -> None:
    probe = LinkProbe(3, 2, "gloo", (ProbePair(1, "cpu", 2, "cpu"),), 8192, 4 << 20, 5, 30.0)
    down: MessageSeal[Down] = MessageSeal(b"s" * 32, "0" * 32, Down, "test")
    request = ProbeRequest(incarnation="1" * 32, probe=probe)
    assert down.open(down.seal(request)) == request
    report = ProbeReport(1, True, figures=(_figures(1, 2, 1e-4, 2e9),))
    up: MessageSeal[Up] = MessageSeal(b"s" * 32, "0" * 32, Up, "test")
    done = ProbeDone(incarnation="1" * 32, n=3, report=report)
    assert up.open(up.seal(done)) == done
    assert report.figures[0].bandwidth_bytes_per_s == pytest.approx(2e9)


def test_one_representative_pair_per_pair_of_workers() -> None:
    cluster = _cluster(["cpu:2x1GiB", "cpu:1x1GiB", "10GiB", "cpu:1x1GiB"])  # worker 3 offers a simulated device
    assert representative([cluster.topology.device("sim:0")]) is None
    pairs = probe_pairs(cluster)
    assert [(p.a_rank, p.b_rank) for p in pairs] == [(1, 2), (1, 4), (2, 4)]
    assert all(p.a_device == p.b_device == "cpu" for p in pairs)


def test_measured_figures_land_on_every_link_between_two_workers() -> None:
    cluster = _cluster(["cpu:2x1GiB", "cpu:2x1GiB"])
    measured = with_measured_links(cluster, (_figures(1, 2, 0.000345, 3.21e9),)).topology
    for a, b in [("cpu:0", "cpu:2"), ("cpu:0", "cpu:3"), ("cpu:1", "cpu:2"), ("cpu:1", "cpu:3")]:
        lk = measured.link(a, b)
        assert lk.measured and lk.kind == "network"
        assert (lk.bandwidth_bytes_per_s, lk.latency_s) == (3.2e9, 0.00034)  # two significant digits
    inside = measured.link("cpu:0", "cpu:1")  # one worker's own devices: untouched
    assert not inside.measured and inside == cluster.topology.link("cpu:0", "cpu:1")
    assert "measured" in json.dumps(measured.to_dict())


def test_planner_prices_and_avoids_the_slow_measured_hop() -> None:
    spec = load_model_spec(MODEL)
    profile = Profile(context_tokens=4096)
    cluster = _cluster(["10GiB", "10GiB", "10GiB"])  # sim:0 on host1, sim:1 on host2, sim:2 on host3
    by_default = plan(spec, cluster.topology, profile, stages=2).require_fit()
    slow, fast = _figures(1, 2, 5e-3, 0.1e9), _figures(1, 3, 2e-5, 10e9)
    measured = with_measured_links(cluster, (slow, fast, _figures(2, 3, 5e-3, 0.1e9))).topology
    cert = plan(spec, measured, profile, stages=2).require_fit()
    order = [s.placement.device_id for s in cert.stages]
    assert "sim:1" in [s.placement.device_id for s in by_default.stages]  # defaults: host2 is as good as host3
    assert order in (["sim:0", "sim:2"], ["sim:2", "sim:0"])  # measured: the fast pair
    link = measured.link(*order)
    assert link.measured
    expected_s = handoff_ps(spec, profile, link) / PS_PER_S
    assert cert.predicted is not None and cert.predicted.handoff_s_per_token == pytest.approx(expected_s)
    default_s = spec.handoff_bytes_per_token(profile) / defaults.NETWORK_BANDWIDTH_BYTES_PER_S + defaults.NETWORK_LATENCY_S
    assert by_default.predicted is not None and by_default.predicted.handoff_s_per_token == pytest.approx(default_s)


# ----- end to end: `stagewise devices --workers` ---------------------------------------------------


@pytest.fixture()
def _only_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("devices",))
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: no wrapped cells


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def two_workers(_only_devices: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Two workers on 'host1' and 'host2' (really 127.0.0.1) joining a coordinator on a free port;
    they read the shared secret from a file, the coordinator from the environment."""
    port = _free_port()
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setenv(SECRET_ENV, "0123456789abcdef0123456789abcdef")
    workers = [subprocess.Popen([sys.executable, "-m", "stagewise", "worker", "--join", f"127.0.0.1:{port}",
                                 "--rank", str(rank), "--devices", "cpu:1x1GiB", "--host-name", f"host{rank}",
                                 "--timeout", "20", "--secret-file", str(secret)], stderr=subprocess.PIPE, text=True)
               for rank in (1, 2)]
    try:
        yield port
        codes = [w.wait(timeout=20) for w in workers]
        errs = [w.stderr.read() if w.stderr else "" for w in workers]
        assert codes == [2, 2] and all("only listed the devices" in e for e in errs), errs  # sent home
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()


def test_devices_workers_json_shows_the_measured_link(two_workers: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices", "--workers", f"2@127.0.0.1:{two_workers}", "--measure", "--json",
                     "--join-timeout", "60"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(d["id"], d["host"]) for d in out["devices"]] == [("cpu:0", "host1"), ("cpu:1", "host2")]
    assert out["workers"] == {"cpu:0": 1, "cpu:1": 2}
    (link,) = out["links_resolved"]
    assert link["between"] == ["cpu:0", "cpu:1"] and link["kind"] == "network" and link["measured"] is True
    assert link["bandwidth"] != defaults.NETWORK_BANDWIDTH_BYTES_PER_S and link["latency_s"] > 0
    assert link["default"] == {"bandwidth": defaults.NETWORK_BANDWIDTH_BYTES_PER_S,
                               "latency_s": defaults.NETWORK_LATENCY_S}


def test_devices_workers_table_prints_measured_beside_default(two_workers: int,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices", "--workers", f"2@127.0.0.1:{two_workers}", "--measure", "--join-timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert "host1 (1)" in out and "host2 (2)" in out
    assert "network" in out and f"(default {defaults.NETWORK_BANDWIDTH_BYTES_PER_S / 1e9:.1f})" in out
    assert "timed by the workers" in out


def test_devices_workers_local_is_refused(_only_devices: None) -> None:
    assert cli.main(["devices", "--workers", "local"]) == 2
