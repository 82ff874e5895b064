"""bench/serve_load.py --peer: the peer's command, the ratios, and a whole run against a second stagewise
server started through the same mechanism as llama-server would be (one client, the same prompts)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from bench.serve_load import _prompts_needed, compare, main, peer_command
from stagewise.weights.make_model import make_model


def test_peer_command_appends_or_fills_model_and_port() -> None:
    assert peer_command("/b/llama-server -ngl 99 -np 64", "/m/x.gguf", 8090) == [
        "/b/llama-server", "-ngl", "99", "-np", "64", "-m", "/m/x.gguf", "--port", "8090"]
    assert peer_command("serve '{model}' --port={port} -v", "a b.gguf", 7) == ["serve", "a b.gguf", "--port=7", "-v"]
    with pytest.raises(SystemExit, match="--peer"):
        peer_command(" ", "m", 1)


def test_fresh_prompts_are_one_per_request_of_every_burst() -> None:
    args = argparse.Namespace(concurrency=[1, 8, 32], passes=2, rate=None, requests=64, fresh_prompts=True)
    assert _prompts_needed(args) == 82
    assert _prompts_needed(argparse.Namespace(**{**vars(args), "rate": 2.0})) == 146
    assert _prompts_needed(argparse.Namespace(**{**vars(args), "fresh_prompts": False})) == 32


def _run(level: int, round_: int, rate: float, ttft: float | None) -> dict[str, object]:
    figures = dict.fromkeys(("ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s"), 0.5)
    return {"concurrency": level, "pass": round_, "output_tokens_per_s": rate, "ttft_p50_s": ttft, **figures}


def test_compare_takes_the_last_pass_level_by_level() -> None:
    ours = [_run(1, 1, 10.0, 1.0), _run(8, 1, 20.0, 1.0), _run(1, 2, 30.0, 0.2), _run(8, 2, 80.0, None)]
    theirs = [_run(1, 1, 99.0, 9.0), _run(1, 2, 15.0, 0.4), _run(8, 2, 40.0, 0.5), _run(32, 2, 1.0, 1.0)]
    rows = compare(ours, theirs)
    assert [r["concurrency"] for r in rows] == [1, 8]
    assert rows[0]["output_tokens_per_s_ratio"] == 2.0 and rows[0]["ttft_p50_s_ratio"] == 0.5
    assert rows[1]["output_tokens_per_s_ratio"] == 2.0 and rows[1]["ttft_p50_s_ratio"] is None
    assert rows[1]["itl_p99_s_ratio"] == 1.0


@pytest.mark.slow
def test_peer_run_measures_both_servers_with_one_client(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model("tiny-qwen3", tmp_path / "tiny.gguf", "gguf", "f32", seed=0)
    serve = "--devices cpu:1GiB --context 128 --max-seqs 2"
    peer = f"{sys.executable} -m stagewise serve {{model}} --port {{port}} {serve}"
    out = tmp_path / "peer.json"
    assert main([str(model), *serve.split(), "--concurrency", "1,2", "--prompt", "12", "--gen", "4", "--passes", "2",
                 "--fresh-prompts", "--peer", peer, "--peer-name", "twin", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["endpoint"] == "chat" and result["in_process"] == {}
    assert result["peer"]["name"] == "twin" and result["peer"]["command"].split()[-2:] == ["--max-seqs", "2"]
    for runs in (result["runs"], result["peer"]["runs"]):
        assert [(r["run"], r["completed"], r["failed"], r["output_tokens"]) for r in runs] == [
            ("burst 1 pass 1", 1, 0, 4), ("burst 2 pass 1", 2, 0, 8), ("burst 1 pass 2", 1, 0, 4),
            ("burst 2 pass 2", 2, 0, 8)]  # ignore_eos: every stream its 4 tokens
        assert [r["first_burst"] for r in runs] == [True, False, False, False]
        assert all(r["ttft_p50_s"] and r["itl_p50_s"] and r["prompt_tokens_mean"] > 12 for r in runs)
    assert result["runs"][0]["prompt_tokens_mean"] == result["peer"]["runs"][0]["prompt_tokens_mean"]
    assert [r["concurrency"] for r in result["comparison"]] == [1, 2]
    assert all(r["output_tokens_per_s_ratio"] > 0 for r in result["comparison"])
    table = capsys.readouterr().out
    assert "burst 2 pass 2 | twin | 2 | 0 |" in table and "stagewise / twin" in table
