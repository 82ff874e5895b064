"""Sequence capacity: the most concurrent sequences a certified placement's stages hold."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stagewise.hardware.device_spec import resolve_device_spec
from stagewise.placement import plan
from stagewise.placement.sequence_capacity import (
    MAX_REPORTED_SEQUENCES,
    SequenceCapacity,
    capacity_table,
    pool_line,
    sequence_capacity,
)
from stagewise.spec.charge import stage_charge
from stagewise.spec.model_source import load_model_spec
from stagewise.spec.profile import Profile

PRESETS = Path(__file__).resolve().parents[1] / "stagewise" / "assets" / "presets"


def _fits_everywhere(cert, spec, profile) -> bool:  # type: ignore[no-untyped-def]
    return all(stage_charge(spec, profile, s.placement.start, s.placement.end, s.placement.entry,
                            s.placement.exit).total_bytes <= s.budget_bytes for s in cert.stages)


@pytest.mark.parametrize(("preset", "fmt", "devices"), [
    ("llama-3.1-8b", "bf16", "24GB,24GB"),
    ("qwen3-30b-a3b", "q8_0", "24GB,24GB"),
    ("qwen3.6-35b-a3b", "q8_0", "22.760GB,22.766GB"),
    ("llama-3.1-70b", "q8_0", "4x24GB"),
])
def test_capacity_is_the_largest_batch_every_stage_holds(preset: str, fmt: str, devices: str) -> None:
    spec = load_model_spec(str(PRESETS / f"{preset}.json"), fmt)
    topology = resolve_device_spec(devices)
    profile = Profile(4096)
    cert = plan(spec, topology, profile)
    assert cert.fits
    for context in (1024, 4096, 32768):
        cap = sequence_capacity(cert, spec, profile, context)
        base = replace(profile, context_tokens=context)
        if cap.sequences:
            assert _fits_everywhere(cert, spec, replace(base, batch=cap.sequences))
        if cap.sequences < MAX_REPORTED_SEQUENCES:
            assert not _fits_everywhere(cert, spec, replace(base, batch=cap.sequences + 1))
            assert cap.limited_by in {s.placement.device_id for s in cert.stages}
    table = capacity_table(cert, spec, profile)
    counts = [row.sequences for row in table]
    assert counts == sorted(counts, reverse=True)  # longer sequences, fewer of them
    assert counts[0] > 1


def test_batch_charges_decode_tokens_not_batch_times_chunk() -> None:
    spec = load_model_spec(str(PRESETS / "llama-3.1-8b.json"), "bf16")
    one = stage_charge(spec, Profile(4096, batch=1), 0, spec.num_blocks, True, True)
    many = stage_charge(spec, Profile(4096, batch=8), 0, spec.num_blocks, True, True)
    per_position = sum(b.kv_values_per_token for b in spec.blocks) * 2  # bf16 keys + values of every block
    assert one.state_bytes == (64 + 1) * 64 * per_position  # a context of 64-position blocks + the scratch block
    assert many.state_bytes == (8 * 64 + 1) * 64 * per_position  # every slot holds a whole context
    # a step carries one chunk or 8 decode tokens (not 8 chunks): 8 sequences add only their rows' logits
    # (bf16 then f32) and, on the torch path, the keys and values each row's attention gathers
    more = 7 * spec.vocab_size * (2 + 4) + 7 * 4096 * spec.blocks[0].kv_values_per_token * 2
    assert many.workspace_bytes - one.workspace_bytes == more
    wide = stage_charge(spec, Profile(4096, batch=1024), 0, spec.num_blocks, True, True)
    assert wide.workspace_bytes > one.workspace_bytes  # 1,024 decode tokens outgrow a 512-token chunk


def test_a_sized_pool_limits_the_sequences_by_its_blocks() -> None:
    spec = load_model_spec(str(PRESETS / "llama-3.1-8b.json"), "bf16")
    topology = resolve_device_spec("24GB,24GB")
    profile = Profile(4096, batch=8, kv_tokens=10 * 1024)  # 160 blocks shared by 8 slots
    cert = plan(spec, topology, profile)
    assert cert.fits
    assert sequence_capacity(cert, spec, profile, 1024).sequences == 10  # 16 blocks each
    assert sequence_capacity(cert, spec, profile, 4096) == SequenceCapacity(4096, 2, "kv pool")
    assert sequence_capacity(cert, spec, profile, 3000).sequences == 3  # 47 blocks each
    assert sequence_capacity(cert, spec, profile, 32768).sequences == 0
    whole = stage_charge(spec, Profile(4096, batch=8), 0, 16, True, False)
    pooled = stage_charge(spec, profile, 0, 16, True, False)
    assert pooled.state_bytes * (8 * 64 + 1) == whole.state_bytes * (160 + 1)  # charged by the pool's blocks
    line = pool_line(profile)
    assert "160 blocks of 64 positions" in line and "10,240" in line


def test_cli_reports_capacity_in_text_and_json() -> None:
    preset = str(PRESETS / "llama-3.1-8b.json")
    cmd = [sys.executable, "-m", "stagewise", "plan", preset, "--devices", "24GB,24GB"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "concurrent sequences on this placement:" in text
    assert "KV pool per stage: 64 blocks of 64 positions (4,096 tokens" in text
    body = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    rows = {row["context_tokens"]: row for row in body["sequence_capacity"]}
    assert rows[4096]["sequences"] >= 1 and rows[4096]["limited_by"] == "sim:0"
    assessed = json.loads(subprocess.run([sys.executable, "-m", "stagewise", "assess", preset, "--devices",
                                          "24GB,24GB", "--json"], capture_output=True, text=True, check=True).stdout)
    assert assessed["sequence_capacity"] == body["sequence_capacity"]
    assert body["kv_pool"] == {"blocks": 64, "block_tokens": 64, "tokens": 4096, "scratch_blocks": 1}
    assert assessed["kv_pool"] == body["kv_pool"]
