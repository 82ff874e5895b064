"""Piped CLI output is whole lines (never wrapped or cut at 80 columns) in one unit style."""

from __future__ import annotations

import pytest

from stagewise.cli.main import main

REFERENCE = "/work/shared/reference"
QWEN36 = f"{REFERENCE}/models/qwen3.6-35b-a3b.json"
TWO_3090 = f"{REFERENCE}/topologies/seed-2x3090-pcie.json"


def test_plan_and_devices_piped_are_whole_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", QWEN36, "--format", "q8_0", "--devices", TWO_3090]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    reason = next(line for line in out.splitlines() if "best attempt overflows" in line)
    assert reason.rstrip().endswith("GB)")  # the reason's budget on its own line, not wrapped onto the next
    assert main(["devices", "--devices", "cpu:2x4GiB"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "virtual cpu" in out and "bandwidth GB/s" in out


def test_bench_table_has_units_and_no_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "random:tiny-qwen3", "--devices", "cpu:1GiB", "--prompt", "8", "--gen", "3",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out
    lines = {line[:28].strip(): line[28:].strip() for line in out.splitlines()[1:]}
    assert lines["prefill"].endswith(" tok/s") and lines["decode"].endswith(" tok/s")
    assert lines["time to first token"].endswith((" ms", " s")) and lines["handoff per token (device)"] == "-"
    assert lines["bytes read per token"].endswith(("KB", "MB")) and lines["roofline fraction"].endswith(" %")
    assert out.splitlines()[0].endswith(("KB)", "MB)", "GB)"))  # the placement line: format_bytes


def test_run_prints_charges_as_serve_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "random:tiny-qwen3", "--devices", "cpu:1GiB", "--prompt-tokens", "1,2", "--max-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].endswith(("KB)", "MB)")) and " GB" not in err
    charges = next(line for line in err.splitlines() if "planned · measured" in line)  # as serve's banner
    assert all(part in charges for part in ("weights ", "state ", "workspace ")) and " GB" not in charges
