"""Issue 46's planner targets on the reference geometries, the longest context that fits, the trades a set
context makes, and an assess output that tells one story.

Qwen3.6-35B-A3B at Q4_K_M on one 22.76 GB device: 32,768 positions fit one sequence, 8,192 fit four (prefix
snapshots take what the sequences leave), 65,536 with fp8 KV; Q8_0 across the seed's two RTX 3090s: 131,072 positions fit one sequence.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import replace

import pytest

from stagewise.cli.main import main
from stagewise.errors import DoesNotFit
from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.hardware.reserve_policy import ReservePolicy
from stagewise.placement.profile_fit import ProfileRequest, fit_profile
from stagewise.placement.sequence_capacity import longest_context
from stagewise.spec.model_source import load_model_spec
from stagewise.spec.profile import Profile

REF = "/work/shared/reference"
QWEN36 = f"{REF}/models/qwen3.6-35b-a3b.json"
SEED = f"{REF}/topologies/seed-2x3090-pcie.json"
GPU = Profile(activation_dtype="bf16", kernel_path="triton")


def _assess(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["assess", *argv, "--json"]) == 0
    return dict(json.loads(out.getvalue()))


def _sequences(body: dict, context: int) -> int:
    return next(r["sequences"] for r in body["sequence_capacity"] if r["context_tokens"] == context)


def test_qwen36_q4_k_m_on_one_capped_gpu() -> None:
    at_32k = _assess(QWEN36, "--format", "q4_k_m", "--devices", "22.76GB", "--context", "32768")
    assert at_32k["outcome"] == "fits_single" and _sequences(at_32k, 32768) >= 1
    assert at_32k["longest_context_one_sequence"] >= 32768
    # four sequences at 8,192, with the prefix cache's recurrent-state snapshots (63 MB each here) or without:
    # snapshots take what the sequences leave, they never cost one
    at_8k = _assess(QWEN36, "--format", "q4_k_m", "--devices", "22.76GB", "--context", "8192", "--no-prefix-cache")
    assert _sequences(at_8k, 8192) >= 4
    cached = _assess(QWEN36, "--format", "q4_k_m", "--devices", "22.76GB", "--context", "8192")
    assert _sequences(cached, 8192) == _sequences(at_8k, 8192) and cached["profile"]["prefix_snapshots"] == 1
    fp8 = _assess(QWEN36, "--format", "q4_k_m", "--devices", "22.76GB", "--context", "65536", "--kv-dtype", "fp8")
    assert fp8["outcome"] == "fits_single" and _sequences(fp8, 65536) >= 1
    assert fp8["profile"]["kv_dtype"] == "fp8"


def test_seed_q8_0_across_two_3090s_at_131072() -> None:
    body = _assess(QWEN36, "--format", "q8_0", "--devices", SEED, "--context", "131072")
    assert body["outcome"] == "fits_across" and len(body["stages"]) == 2
    assert _sequences(body, 131072) >= 1
    for stage in body["stages"]:  # the workspace no longer outweighs the KV
        assert stage["charge"]["workspace_bytes"] < stage["charge"]["state_bytes"]


def _qwen36_on(devices: str) -> tuple:
    spec = load_model_spec(QWEN36, "q4_k_m", run_dtype="bf16")
    return spec, resolve_device_spec(devices, ReservePolicy.parse(None))


def test_unset_context_takes_the_longest_that_fits_one_sequence() -> None:
    spec, topology = _qwen36_on("22.76GB")
    fitted = fit_profile(spec, topology, ProfileRequest(GPU))
    assert fitted.profile.batch == 1 and fitted.profile.context_tokens % 64 == 0
    assert fitted.profile.context_tokens == longest_context(fitted.cert, spec, fitted.profile)
    assert fitted.choice.endswith("the longest context that fits")
    # one block more fits only without the prefix snapshot; with the snapshot kept, it does not
    more = fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=fitted.profile.context_tokens + 64,
                                                      prefill_chunk_tokens=512))
    assert more.profile.prefix_snapshots == 0 and fitted.profile.prefix_snapshots == 1
    with pytest.raises(DoesNotFit):
        fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=fitted.profile.context_tokens + 64,
                                                   prefill_chunk_tokens=512, prefix_snapshots=1))
    # a budget that holds the model's whole context says so
    roomy = fit_profile(spec, resolve_device_spec("40GB", ReservePolicy.parse(None)), ProfileRequest(GPU))
    assert roomy.profile.context_tokens == 262144 and roomy.choice.endswith("the model's longest context")


def test_set_context_trades_sequences_then_the_chunk_then_refuses() -> None:
    spec, topology = _qwen36_on("22.76GB")
    auto = fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=8192, batch=None, prefix_snapshots=0))
    assert auto.profile.batch == 4 and auto.profile.prefill_chunk_tokens == 512  # sequences first
    cached = fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=8192, batch=None))
    assert cached.profile.batch == 4 and cached.profile.prefill_chunk_tokens == 512  # the snapshots give way
    kept = cached.profile.prefix_snapshots
    assert kept < 4 and cached.choice == ("8,192 positions, 4 sequences, prefill chunks of 512: "
                                          f"prefix snapshots for {kept} of the 4 sequences (what they leave)")
    with pytest.raises(DoesNotFit):  # the most that fit beside them
        fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=8192, batch=4, prefill_chunk_tokens=512,
                                                   prefix_snapshots=kept + 1))
    unset = fit_profile(spec, topology, ProfileRequest(GPU))  # the longest context keeps a snapshot a slot
    longest = unset.profile.context_tokens
    assert unset.profile.prefix_snapshots == 1
    dropped = fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=longest + 1024, batch=None))
    assert (dropped.profile.prefix_snapshots, dropped.profile.prefill_chunk_tokens) == (0, 512)  # the snapshot first
    traded = fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=longest + 4096, batch=None))
    assert traded.profile.batch == 1 and traded.profile.prefill_chunk_tokens < 512  # then the chunk
    assert re.fullmatch(rf"{longest + 4096:,} positions, 1 sequence, prefill chunks of (256|128): "
                        "the most this budget holds"
                        "(, prefix snapshots for 0 of the 1 sequences \\(what they leave\\))?",
                        traded.choice)  # a smaller chunk may leave room for the sequence's snapshot
    with pytest.raises(DoesNotFit, match=r"also tried prefill chunks of 256, 128"):
        fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=200_000, batch=None))
    # a chunk the user set is not traded
    with pytest.raises(DoesNotFit):
        fit_profile(spec, topology, ProfileRequest(GPU, context_tokens=longest + 4096, prefill_chunk_tokens=512))


def test_fp8_kv_holds_about_twice_the_context() -> None:
    spec, topology = _qwen36_on("22.76GB")
    bf16 = fit_profile(spec, topology, ProfileRequest(GPU)).profile.context_tokens
    fp8 = fit_profile(spec, topology, ProfileRequest(replace(GPU, kv_dtype="fp8"))).profile.context_tokens
    assert 1.8 * bf16 < fp8 < 2.1 * bf16


def test_does_not_fit_headline_and_bars_tell_one_story_in_the_units_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["assess", f"{REF}/models/llama-3.1-70b.json", "--devices", "24GiB,12GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    head = re.search(r"best attempt needs ([0-9.]+ GiB) on (sim:\d), budget ([0-9.]+ GiB)", out)
    assert head is not None, out
    needs, device, budget = head.groups()
    bar = re.search(rf"{device} [█·]+ ([0-9.]+ GiB) / ([0-9.]+ GiB) blocks [0-9.]+ \S+( \+\w+)? OVER", out)
    assert bar is not None, out
    assert bar.groups()[:2] == (needs, budget)  # the headline's attempt is the bar that overflows
    assert "whole model" not in out and " GB" not in out  # GiB given, GiB printed
    body = _assess(f"{REF}/models/llama-3.1-70b.json", "--devices", "24GiB,12GiB")
    attempt = body["attempt"]
    assert attempt[-1]["device"] == body["limiting_device"]
    assert attempt[-1]["charge"]["total_bytes"] == body["required_bytes"]
