"""``stagewise devices / assess / plan`` end to end (through the real dispatcher)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stagewise.cli import main as cli

REF = "/work/shared/reference"
MODEL = f"{REF}/models/qwen3.6-35b-a3b.json"
SEED = f"{REF}/topologies/seed-2x3090-pcie.json"


@pytest.fixture(autouse=True)
def _only_my_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: other commands are built in parallel; keep this test independent of them.
    monkeypatch.setattr(cli, "COMMANDS", ("devices", "assess", "plan"))


def test_plan_json_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", MODEL, "--format", "q8_0", "--devices", SEED, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "fits_across"
    assert [s["device"] for s in out["stages"]] == ["cuda:0", "cuda:1"]
    assert set(out["stages"][0]["charge"]) == {"weights_bytes", "state_bytes", "workspace_bytes", "reserve_bytes", "total_bytes"}
    assert set(out["predicted"]) >= {"decode_tokens_per_s", "prefill_tokens_per_s", "handoff_s_per_token"}


def test_assess_json_equals_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    cli.main(["assess", MODEL, "--format", "q8_0", "--devices", SEED, "--json"])
    a = capsys.readouterr().out
    cli.main(["plan", MODEL, "--format", "q8_0", "--devices", SEED, "--json"])
    assert a == capsys.readouterr().out


def test_assess_human(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["assess", MODEL, "--format", "q8_0", "--devices", SEED]) == 0
    out = capsys.readouterr().out
    assert "Fits across 2 GPUs" in out and "cuda:1" in out
    assert cli.main(["assess", MODEL, "--format", "q8_0", "--devices", "cuda:0@22.76GB"]) == 2  # no CUDA here


def test_assess_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "qwen3-8b").mkdir()
    (tmp_path / "qwen3-8b" / "config.json").write_text(Path(f"{REF}/models/qwen3-8b.json").read_text())
    (tmp_path / "llama.json").write_text(Path(f"{REF}/models/llama-3.1-8b.json").read_text())
    (tmp_path / "broken.gguf").write_bytes(b"GGUF")
    assert cli.main(["assess", str(tmp_path), "--devices", "24GiB", "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["qwen3-8b"]["outcome"] == "fits_single"
    assert rows["llama.json"]["outcome"] == "fits_single"
    assert rows["broken.gguf"]["outcome"] == "error"


def test_plan_overrides_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", MODEL, "--format", "q8_0", "--devices", SEED, "--split", "21,19", "--order", "cuda:1,cuda:0"]) == 0
    assert "cuda:1" in capsys.readouterr().out
    assert cli.main(["plan", MODEL, "--format", "q8_0", "--devices", SEED, "--split", "30,30"]) == 2
    assert "--split" in capsys.readouterr().err
    assert cli.main(["plan", MODEL, "--devices", "2x1GiB"]) == 1
    assert cli.main(["plan", MODEL, "--devices", "/nonexistent/topo.json"]) == 2
    assert "cannot read topology file" in capsys.readouterr().err


def test_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["devices", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"][0]["id"] == "cpu:0"
    assert cli.main(["devices", "--devices", "cpu:2x4GiB"]) == 0
    assert "same-device" in capsys.readouterr().out


def _one_gpu(tmp_path: Path, budget_bytes: int = 22_760_000_000) -> str:
    """The seed topology's cuda:0 alone (simulated: planned for, no GPU needed)."""
    topo = json.loads(Path(SEED).read_text())
    topo["devices"] = [d | {"budget_bytes": budget_bytes} for d in topo["devices"] if d["id"] == "cuda:0"]
    topo["links"] = []
    path = tmp_path / "cuda0.json"
    path.write_text(json.dumps(topo))
    return str(path)


def test_seed_model_at_q4_k_m_fits_one_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue #29: Qwen3.6-35B-A3B Q4_K_M (~21.2 GB of packed tensors) on cuda:0@22.76GB
    assert cli.main(["assess", MODEL, "--format", "q4_k_m", "--devices", _one_gpu(tmp_path)]) == 0
    assert "Fits on cuda:0" in capsys.readouterr().out
    assert cli.main(["plan", MODEL, "--format", "q4_k_m", "--devices", _one_gpu(tmp_path), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["outcome"] == "fits_single"
    assert body["expanded"] == []
    assert cli.main(["assess", MODEL, "--format", "q8_0", "--devices", _one_gpu(tmp_path)]) == 0
    assert "does not fit" in capsys.readouterr().out  # Q8_0 (~36.9 GB) needs two


def test_llama_70b_q4_k_m_fits_across_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    # Llama-3.1-70B Q4_K_M: 42.5 GB of tensors over the seed's 22.760 + 22.766 GB. With the workspace
    # charged per kernel path (no score matrix on GPUs, logits of the last rows only, one decode graph per
    # batch bucket whatever the context, the packed steps' graph buffers) the default 4,096-token context
    # fits; the longest that does is 6,336
    model = f"{REF}/models/llama-3.1-70b.json"
    assert cli.main(["assess", model, "--format", "q4_k_m", "--devices", SEED]) == 0
    assert "Fits across 2 GPUs" in capsys.readouterr().out
    assert cli.main(["plan", model, "--format", "q4_k_m", "--devices", SEED, "--context", "6336"]) == 0
    capsys.readouterr()
    assert cli.main(["plan", model, "--format", "q4_k_m", "--devices", SEED, "--context", "6400"]) == 1


def test_expanded_types_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["assess", MODEL, "--format", "iq2_xs", "--devices", SEED]) == 0
    out = capsys.readouterr().out
    assert "tensors of IQ2_XS are expanded to bf16: +" in out
