"""STAGEWISE_KERNELS: the two accepted values, and a typed one-line error for anything else."""

from __future__ import annotations

import pytest

from stagewise.cli.main import main
from stagewise.errors import ConfigError
from stagewise.kernels.triton_launch import kernels_mode


@pytest.mark.parametrize(("value", "mode"), [("", "triton"), ("triton", "triton"), ("TORCH", "torch")])
def test_accepted_values(value: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGEWISE_KERNELS", value)
    assert kernels_mode() == mode


def test_bad_value_is_a_one_line_cli_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STAGEWISE_KERNELS", "cuda-graphs")
    with pytest.raises(ConfigError):
        kernels_mode()
    assert main(["devices"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stagewise: error: STAGEWISE_KERNELS='cuda-graphs': expected 'triton' or 'torch'"]
