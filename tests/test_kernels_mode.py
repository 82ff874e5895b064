"""STAGEWISE_KERNELS and STAGEWISE_PDL: the accepted values, and a typed one-line error for anything else."""

from __future__ import annotations

import pytest
import torch

from stagewise.cli.main import main
from stagewise.errors import ConfigError
from stagewise.kernels.triton_launch import dependent_launch, kernels_mode, pdl_enabled


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


def test_dependent_launch_values_and_where_it_applies(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STAGEWISE_PDL", "0")
    assert not pdl_enabled()
    monkeypatch.setenv("STAGEWISE_PDL", "1")
    assert pdl_enabled()
    assert dependent_launch(torch.zeros(1)) == {"GDC": False}  # the host (Triton's interpreter): an ordinary launch
    monkeypatch.setenv("STAGEWISE_PDL", "yes")
    with pytest.raises(ConfigError):
        pdl_enabled()
    assert main(["devices"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["stagewise: error: STAGEWISE_PDL='yes': expected '0' or '1'"]
