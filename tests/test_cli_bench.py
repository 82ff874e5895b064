"""``stagewise bench`` on virtual CPU devices: the report's shape, and the transformers baseline on the
same random weights (CPU timings are not performance figures; they only exercise the path)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from stagewise.cli.main import main


def _bench(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", *argv, "--json"]) == 0
    return json.loads(out.getvalue())


def test_bench_reports_speeds_and_the_baseline_ratio() -> None:
    result = _bench("random:tiny-qwen3", "--devices", "cpu:2x1GiB", "--placement", "pipeline:2",
                    "--prompt", "16", "--gen", "4", "--repeats", "1", "--baseline", "transformers")
    ours = result["stagewise"]
    assert len(result["placement"]["stages"]) == 2
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "bytes_read_per_token", "roofline_fraction"):
        assert ours[key] > 0, key
    assert len(ours["stage_step_s"]) == 2 and ours["generated_tokens"] == 4
    # the roofline uses the bandwidth measured in this run, beside the topology's datasheet figure
    assert ours["bandwidth_measured"] is True and ours["bandwidth_bytes_per_s"] > 0
    assert ours["datasheet_bandwidth_bytes_per_s"] > 0
    assert ours["roofline_fraction"] == pytest.approx(
        ours["decode_tokens_per_s"] * ours["bytes_read_per_token"] / ours["bandwidth_bytes_per_s"])
    assert result["transformers"]["decode_tokens_per_s"] > 0
    assert set(result["ratio_vs_transformers"]) == {"decode", "prefill"}


def test_bench_q8_0_random_weights_one_stage() -> None:
    result = _bench("random:tiny-qwen3-moe@q8_0", "--devices", "cpu:1x1GiB", "--prompt", "8", "--gen", "3",
                    "--repeats", "1")
    assert result["placement"]["outcome"] == "fits_single"
    assert result["stagewise"]["generated_tokens"] == 3


@pytest.mark.parametrize("model", ["random:tiny-qwen3@q8_0", "missing.gguf"])
def test_baseline_refuses_a_model_transformers_cannot_run_before_loading(model: str, capsys, monkeypatch) -> None:
    def no_load(*args, **kwargs):
        raise AssertionError("loaded a model the baseline cannot run")

    monkeypatch.setattr("stagewise.engine.model_loading.load_model_from_args", no_load)
    assert main(["bench", model, "--devices", "cpu:1x1GiB", "--baseline", "transformers"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--baseline transformers" in err
