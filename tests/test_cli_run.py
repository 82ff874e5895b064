"""``stagewise run``: greedy tokens equal transformers' generate; staged runs equal single; bad input exits 2."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stagewise.cli.main import main
from tests.hf_models import LLAMA_CONFIGS, QWEN3_CONFIGS, make_hf_model

PROMPT = [3, 17, 42, 5, 99, 23, 7, 64]


def run_json(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", *argv, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize(("family", "overrides"), [("llama", LLAMA_CONFIGS["llama3-rope-tied"] | {"num_hidden_layers": 4}),
                                                   ("qwen3", QWEN3_CONFIGS["qwen3-gqa"])])
def test_run_matches_transformers_generate(tmp_path: Path, family: str, overrides: dict) -> None:
    hf = make_hf_model(family, overrides, tmp_path, seed=11)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    ref_tokens = ref.sequences[0, len(PROMPT):].tolist()
    ref_logprobs = [float(torch.log_softmax(lg[0].float(), -1)[t]) for lg, t in zip(ref.logits, ref_tokens, strict=False)]
    prompt = ",".join(map(str, PROMPT))
    single = run_json(str(tmp_path), "--prompt-tokens", prompt, "--max-tokens", "16", "--temperature", "0")
    assert single["tokens"] == ref_tokens
    assert single["logprobs"] == pytest.approx(ref_logprobs, abs=1e-4)
    assert single["placement"]["outcome"] == "fits_single"
    staged = run_json(str(tmp_path), "--prompt-tokens", prompt, "--max-tokens", "16", "--temperature", "0",
                      "--devices", "cpu:3x2GiB", "--placement", "pipeline:3", "--prefill-chunk", "3")
    assert [s["device"] for s in staged["placement"]["stages"]] == ["cpu:0", "cpu:1", "cpu:2"]
    assert staged["tokens"] == ref_tokens


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stagewise", *argv], capture_output=True, text=True, timeout=120)


def test_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    good = tmp_path / "good"
    make_hf_model("llama", LLAMA_CONFIGS["llama-gqa"], good, seed=1)
    cases = {}
    cases["missing dir"] = tmp_path / "nope"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    cases["missing config"] = empty
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    cfg = json.loads((good / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps(cfg | {"model_type": "mamba9"}))
    (unknown / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    cases["unknown model_type"] = unknown
    shaped = tmp_path / "shaped"
    shaped.mkdir()
    (shaped / "config.json").write_text(json.dumps(cfg | {"intermediate_size": cfg["intermediate_size"] + 8}))
    (shaped / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    cases["mis-shaped tensor"] = shaped
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": cfg["num_hidden_layers"] + 1}))
    (missing / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    cases["missing tensor"] = missing
    expect = {"missing dir": "nope", "missing config": "config.json", "unknown model_type": "mamba9",
              "mis-shaped tensor": "shape", "missing tensor": "missing tensor"}
    for label, path in cases.items():
        proc = _cli("run", str(path), "--prompt-tokens", "1,2", "--max-tokens", "2", "--json")
        assert proc.returncode == 2, (label, proc.stderr)
        assert "Traceback" not in proc.stderr, label
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expect[label] in lines[0], (label, proc.stderr)


def test_run_text_and_chat_on_the_demo_model() -> None:
    text = run_json("-p", "Hello there", "--max-tokens", "4")
    assert len(text["tokens"]) <= 4 and isinstance(text["text"], str)
    assert text["placement"]["outcome"] == "fits_across"  # the demo needs two virtual devices
    chat = run_json("--chat", "Hello", "--max-tokens", "4")
    assert isinstance(chat["text"], str) and chat["tokens"]


def test_unknown_dtype_is_a_typed_error() -> None:
    assert main(["run", "--dtype", "float8", "--prompt-tokens", "1", "--max-tokens", "1"]) == 2
