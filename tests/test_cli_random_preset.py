"""``stagewise assess|plan random:PRESET`` through the CLI entry (documented in the README's MODEL forms)."""

from __future__ import annotations

import json

import pytest

from stagewise.cli.main import main


@pytest.mark.parametrize(("model", "fmt"), [("random:tiny-llama", "bf16"), ("random:tiny-llama@q8_0", "q8_0")])
def test_assess_random_preset(model: str, fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["assess", model, "--devices", "1x1GiB", "--json"]) == 0
    placement = json.loads(capsys.readouterr().out)
    assert placement["outcome"].startswith("fits") and placement["model"] == model
    assert main(["assess", model, "--devices", "1x1GiB"]) == 0
    out = capsys.readouterr().out
    assert f"({model}, {fmt}," in out


def test_assess_random_unknown_preset_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["assess", "random:no-such-preset", "--devices", "1x1GiB"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stagewise: error: no-such-preset: no such config file or preset") and "Traceback" not in err


@pytest.mark.parametrize("model", ["random:tiny-llama", "random:tiny-qwen3.6@q8_0"])
def test_plan_takes_what_assess_takes(model: str, capsys: pytest.CaptureFixture[str]) -> None:
    """One reading of MODEL for both planning commands: the same spec, so the same certified placement."""
    assert main(["assess", model, "--devices", "cpu:2x64MiB", "--json"]) == 0
    assessed = json.loads(capsys.readouterr().out)
    assert main(["plan", model, "--devices", "cpu:2x64MiB", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["model"] == model and planned["fingerprint"] == assessed["fingerprint"]
    assert main(["plan", model, "--devices", "cpu:2x64MiB", "--format", "q8_0"]) == 2
    assert "format is part of its name" in capsys.readouterr().err
